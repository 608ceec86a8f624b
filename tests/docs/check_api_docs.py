#!/usr/bin/env python3
"""Every public symbol of ccq's headers is documented in the Doxygen reference.

Doxygen warns about an undocumented member only inside a documented file or struct, and
never about an undocumented enum value; so this reads Doxygen's XML output and checks every
item itself, and compares what the reference lists with what the headers declare (a header
without a @file block would otherwise drop out of the reference silently).

Usage: check_api_docs.py XML_DIR INCLUDE_DIR
Exit status 0 if everything is documented, 1 with the list of what is not.
"""
import os
import re
import sys
import xml.etree.ElementTree as ET

HEADERS = ["ccq.h", "ccq/version.h", "ccq/ccq_nccl.h"]
# Macros that exist only to expand another one (EXCLUDE_SYMBOLS in docs/api/Doxyfile.in),
# and the include guards.
NOT_API = {"CCQ_STATUS_ENUM_", "CCQ_STRINGIFY_", "CCQ_H", "CCQ_VERSION_H", "CCQ_NCCL_H"}


def text(node):
    return "".join(node.itertext()).strip() if node is not None else ""


def described(node):
    return bool(text(node.find("briefdescription")) or text(node.find("detaileddescription")))


def strip_comments(src):
    src = re.sub(r"/\*.*?\*/", " ", src, flags=re.S)
    return re.sub(r"//[^\n]*", " ", src)


def top_level_decls(src):
    """Declarations at file scope (split at ';' outside braces), preprocessor lines removed."""
    src = re.sub(r"#ifdef __cplusplus.*?#endif", " ", src, flags=re.S)  # extern "C" { }
    code = "\n".join(l for l in src.splitlines() if not l.lstrip().startswith("#"))
    depth, cur, out = 0, [], []
    for c in code:
        depth += (c == "{") - (c == "}")
        if c == ";" and depth == 0:
            out.append(" ".join("".join(cur).split()))
            cur = []
        else:
            cur.append(c)
    return out


def declared(include):
    """What the headers declare: functions (CCQ_API), macros, typedefs (with the enums and
    structs they name)."""
    fns, macros, types = set(), set(), set()
    for h in HEADERS:
        with open(os.path.join(include, h)) as f:
            src = strip_comments(f.read())
        macros |= set(re.findall(r"^\s*#\s*define\s+(\w+)", src, re.M))
        for d in top_level_decls(src):
            if d.startswith("CCQ_API "):
                # `void(ccq_config_init)(...)` keeps a name in parentheses from the macro.
                m = re.match(r"CCQ_API [^(]*\((\w+)\)\s*\(", d) or \
                    re.match(r"CCQ_API [^(]*?(\w+)\s*\(", d)
                fns.add(m.group(1))
            elif d.startswith("typedef "):
                fp = "{" not in d and re.search(r"\(\s*\*\s*(\w+)\s*\)\s*\(", d)
                types.add(fp.group(1) if fp else re.findall(r"\w+", d)[-1])
    macros -= NOT_API
    return fns, macros, types


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    xml, include = sys.argv[1:]
    index = ET.parse(os.path.join(xml, "index.xml")).getroot()
    missing, seen = [], {"function": set(), "define": set(), "typedef": set()}
    named_types = set()  # enums and structs (TYPEDEF_HIDES_STRUCT shows their typedefs so)
    files = set()
    for comp in index.findall("compound"):
        kind = comp.get("kind")
        if kind not in ("file", "struct") or comp.findtext("name", "").endswith(".md"):
            continue
        doc = ET.parse(os.path.join(xml, comp.get("refid") + ".xml")).getroot()
        cdef = doc.find("compounddef")
        name = text(cdef.find("compoundname"))
        if kind == "file":
            files.add(name)
            if not described(cdef):
                missing.append("file %s (no @file block)" % name)
        else:
            named_types.add(name)
            if not described(cdef):
                missing.append("struct %s" % name)
        for m in cdef.iter("memberdef"):
            mkind, mname = m.get("kind"), text(m.find("name"))
            if mname in NOT_API:
                continue
            if mkind in seen:
                seen[mkind].add(mname)
            if mkind == "enum":
                named_types.add(mname)
            if not described(m):
                missing.append("%s %s (%s)" % (mkind, mname, name))
            if mkind == "enum":
                whole = text(m.find("detaileddescription")) + text(m.find("briefdescription"))
                for v in m.findall("enumvalue"):
                    vname = text(v.find("name"))
                    # The statuses come from an X-macro: they are documented in the enum's
                    # table, which must name each of them.
                    if not described(v) and vname not in whole:
                        missing.append("enum value %s (%s)" % (vname, mname))
    for h in HEADERS:
        if h not in files and os.path.basename(h) not in files:
            missing.append("file %s is not in the reference" % h)
    fns, macros, types = declared(include)
    for what, want, have in (("function", fns, seen["function"]),
                             ("macro", macros, seen["define"]),
                             ("typedef", types, seen["typedef"] | named_types)):
        for n in sorted(want - have):
            missing.append("%s %s is declared in the headers but not in the reference" % (what, n))
    if not fns:
        missing.append("no CCQ_API function found in the headers: the parser is broken")
    for m in missing:
        print("undocumented:", m)
    print("%d functions, %d macros, %d typedefs checked; %d undocumented"
          % (len(seen["function"]), len(seen["define"]), len(seen["typedef"]), len(missing)))
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
