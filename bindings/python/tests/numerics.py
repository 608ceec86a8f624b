"""Reference values for the tests: bfloat16 and float8 bits in uint16/uint8 arrays (the
types NumPy lacks), decoded and encoded exactly, and the reduction of NumPy arrays with ccq's
semantics (integers wrap; AVG truncates on integers). Independent of ccq."""

import numpy as np

import ccq


def _fp8_table(exp_bits, man_bits, bias, fn):
    """The value of each of the 256 codes of an 8-bit float (fn: no infinities, only the
    all-ones code is NaN, as float8_e4m3fn)."""
    vals = np.empty(256, np.float64)
    for code in range(256):
        s = -1.0 if code & 0x80 else 1.0
        e = (code >> man_bits) & ((1 << exp_bits) - 1)
        m = code & ((1 << man_bits) - 1)
        top = (1 << exp_bits) - 1
        if fn and e == top and m == (1 << man_bits) - 1:
            vals[code] = np.nan
        elif not fn and e == top:
            vals[code] = s * np.inf if m == 0 else np.nan
        elif e == 0:
            vals[code] = s * m / (1 << man_bits) * 2.0 ** (1 - bias)
        else:
            vals[code] = s * (1 + m / (1 << man_bits)) * 2.0 ** (e - bias)
    return vals


FP8 = {
    ccq.FLOAT8E4M3: _fp8_table(4, 3, 7, fn=True),
    ccq.FLOAT8E5M2: _fp8_table(5, 2, 15, fn=False),
}


def decode(bits, dtype):
    """Raw bits (uint16 for bfloat16, uint8 for float8) -> float64 values."""
    if dtype == ccq.BFLOAT16:
        with np.errstate(invalid="ignore"):  # NaN payloads
            return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return FP8[dtype][bits]


def encode(values, dtype):
    """Exactly representable float64 values -> raw bits; raises if one is not exact."""
    values = np.asarray(values, np.float64)
    if dtype == ccq.BFLOAT16:
        f = values.astype(np.float32)
        bits = (f.view(np.uint32) >> 16).astype(np.uint16)
    else:
        table = FP8[dtype]
        lookup = {}
        for code in range(256):
            v = table[code]
            if not np.isnan(v) and v not in lookup and not (v == 0 and code & 0x80):
                lookup[v] = code
        bits = np.array([lookup[v] for v in values.ravel()], np.uint8).reshape(values.shape)
    assert np.array_equal(decode(bits, dtype), values), "value not exact in %s" % dtype
    return bits


#: dtype -> (NumPy type of the buffers, whether they are raw bits of a type NumPy lacks)
NUMPY = {
    ccq.INT8: (np.int8, False),
    ccq.UINT8: (np.uint8, False),
    ccq.INT32: (np.int32, False),
    ccq.UINT32: (np.uint32, False),
    ccq.INT64: (np.int64, False),
    ccq.UINT64: (np.uint64, False),
    ccq.FLOAT16: (np.float16, False),
    ccq.FLOAT32: (np.float32, False),
    ccq.FLOAT64: (np.float64, False),
    ccq.BFLOAT16: (np.uint16, True),
    ccq.FLOAT8E4M3: (np.uint8, True),
    ccq.FLOAT8E5M2: (np.uint8, True),
}


def inputs(dtype, op, ranks, count, seed):
    """One array per rank whose reduction is exact in dtype: integers over their whole range
    for SUM/PROD/MAX/MIN (they wrap), small values otherwise."""
    rng = np.random.default_rng(seed)
    npt, raw = NUMPY[dtype]
    if raw or np.issubdtype(npt, np.floating):
        # Small integers: every sum, product, max, min and quarter of them over 4 ranks is
        # exact even in float8_e5m2 (2 mantissa bits).
        lo, hi = (1, 2) if op == ccq.PROD else (-1, 1)
        vals = [rng.integers(lo, hi, count, endpoint=True).astype(np.float64)
                for _ in range(ranks)]
        return [encode(v, dtype) if raw else v.astype(npt) for v in vals]
    info = np.iinfo(npt)
    if op == ccq.AVG:
        # The sum must not wrap (ccq's integer AVG divides the sum): small values.
        return [rng.integers(0, 30, count).astype(npt) for _ in range(ranks)]
    return [rng.integers(info.min, info.max, count, dtype=npt, endpoint=True)
            for _ in range(ranks)]


def reduce(arrays, dtype, op):
    """The reduction of the arrays as ccq defines it, in the arrays' own representation."""
    npt, raw = NUMPY[dtype]
    if raw:
        vals = [decode(a, dtype) for a in arrays]
        out = _reduce_values(vals, op, float_avg=True)
        return encode(out, dtype)
    if np.issubdtype(npt, np.floating):
        return _reduce_values([a.astype(np.float64) for a in arrays], op, float_avg=True).astype(npt)
    with np.errstate(over="ignore"):
        if op == ccq.SUM:
            r = arrays[0].copy()
            for a in arrays[1:]:
                r = (r + a).astype(npt)
            return r
        if op == ccq.PROD:
            r = arrays[0].copy()
            for a in arrays[1:]:
                r = (r * a).astype(npt)
            return r
    if op == ccq.MAX:
        return np.maximum.reduce(arrays)
    if op == ccq.MIN:
        return np.minimum.reduce(arrays)
    # AVG on integers: the sum (no overflow with these inputs), divided with truncation.
    s = sum(a.astype(np.int64) for a in arrays)
    return (np.sign(s) * (np.abs(s) // len(arrays))).astype(npt)


def _reduce_values(vals, op, float_avg):
    if op == ccq.SUM:
        return np.sum(vals, axis=0)
    if op == ccq.PROD:
        return np.prod(vals, axis=0)
    if op == ccq.MAX:
        return np.max(vals, axis=0)
    if op == ccq.MIN:
        return np.min(vals, axis=0)
    return np.sum(vals, axis=0) / len(vals)


def zeros_like_dtype(dtype, count):
    npt, _ = NUMPY[dtype]
    return np.zeros(count, npt)


def kw_dtype(dtype):
    """The dtype= keyword a call needs: only for raw bits (NumPy's own types name themselves)."""
    return {"dtype": dtype} if NUMPY[dtype][1] else {}
