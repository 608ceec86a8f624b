// Gloo's allreduce timing, the peer benchmark of docs/performance.md ("Across processes"):
// float32 sum, out of place, TCP on loopback, processes meeting through a FileStore; the
// same sizes and statistics as bench/mpi_allreduce.c (mean time per op over -n iterations
// after -w warm-ups, the slowest process's time; a Gloo barrier starts each size). Launch
// with mpirun (only its OMPI_COMM_WORLD_RANK/SIZE are read: no MPI call) or set
// GLOO_RANK/GLOO_SIZE. One JSON object per size on stdout.
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

static size_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    if (*end == 'G' || *end == 'g')
        v *= 1024.0 * 1024.0 * 1024.0;
    else if (*end == 'M' || *end == 'm')
        v *= 1024.0 * 1024.0;
    else if (*end == 'K' || *end == 'k')
        v *= 1024.0;
    return (size_t)v;
}

static int env_int(const char *a, const char *b, int def)
{
    const char *v = getenv(a);
    if (v == nullptr)
        v = getenv(b);
    return v != nullptr ? atoi(v) : def;
}

int main(int argc, char **argv)
{
    size_t minb = 8, maxb = 64u << 20;
    double factor = 2;
    int iters = 20, warmup = 5;
    const char *dir = getenv("GLOO_STORE_DIR") ? getenv("GLOO_STORE_DIR") : "/tmp/ccq-gloo-store";
    const char *prefix = getenv("GLOO_PREFIX") ? getenv("GLOO_PREFIX") : "bench";
    int rank = env_int("GLOO_RANK", "OMPI_COMM_WORLD_RANK", 0);
    int size = env_int("GLOO_SIZE", "OMPI_COMM_WORLD_SIZE", 1);
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-b"))
            minb = parse_size(argv[i + 1]);
        else if (!strcmp(argv[i], "-e"))
            maxb = parse_size(argv[i + 1]);
        else if (!strcmp(argv[i], "-f"))
            factor = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "-n"))
            iters = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-w"))
            warmup = atoi(argv[i + 1]);
    }
    gloo::transport::tcp::attr attr;
    attr.iface = "lo";
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore fs(dir);
    gloo::rendezvous::PrefixStore store(prefix, fs);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
    ctx->connectFullMesh(store, dev);

    std::vector<float> src(maxb / 4 + 1, (float)(rank + 1)), dst(maxb / 4 + 1, 0.0f);
    std::vector<double> t(1), tmax(1);
    auto run = [&](size_t count) {
        gloo::AllreduceOptions opts(ctx);
        opts.setInput(src.data(), count);
        opts.setOutput(dst.data(), count);
        opts.setReduceFunction(
            static_cast<void (*)(void *, const void *, const void *, size_t)>(&gloo::sum<float>));
        gloo::allreduce(opts);
    };
    for (size_t bytes = minb; bytes <= maxb; bytes = (size_t)((double)bytes * factor)) {
        size_t count = bytes / sizeof(float);
        for (int i = 0; i < warmup; i++)
            run(count);
        gloo::BarrierOptions bo(ctx);
        gloo::barrier(bo);
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; i++)
            run(count);
        t[0] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
        gloo::AllreduceOptions mo(ctx); // the slowest process's time
        mo.setInput(t.data(), 1);
        mo.setOutput(tmax.data(), 1);
        mo.setReduceFunction(
            static_cast<void (*)(void *, const void *, const void *, size_t)>(&gloo::max<double>));
        gloo::allreduce(mo);
        int wrong = count > 0 && dst[0] != (float)(size * (size + 1) / 2);
        if (rank == 0) {
            double algbw = (double)bytes / tmax[0] / 1e9;
            printf("{\"size\": %zu, \"count\": %zu, \"time_us\": %.3f, \"algbw\": %.4f, "
                   "\"busbw\": %.4f, \"wrong\": %d}\n",
                   bytes, count, tmax[0] * 1e6, algbw, algbw * 2.0 * (size - 1) / size, wrong);
            fflush(stdout);
        }
    }
    return 0;
}
