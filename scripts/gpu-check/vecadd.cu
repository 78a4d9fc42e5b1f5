// GSaaS's GPU check (scripts/gpu-check.sh): a vector add and a 256 MiB round trip between host
// and device, with what each took. Run once through a LUPINE client that reaches the GPU only
// through a VM's masked endpoint, and once on the GPU directly; each run prints one line per
// measurement and exits non-zero when a result is wrong or a CUDA call fails.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cuda_runtime.h>

#define CHECK(call)                                                                          \
    do {                                                                                     \
        cudaError_t err_ = (call);                                                           \
        if (err_ != cudaSuccess) {                                                           \
            std::fprintf(stderr, "FAILED: %s: %s (%s:%d)\n", #call, cudaGetErrorString(err_), \
                         __FILE__, __LINE__);                                                \
            std::exit(1);                                                                    \
        }                                                                                    \
    } while (0)

__global__ void add(const float *a, const float *b, float *c, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

static double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int main() {
    int count = 0;
    CHECK(cudaGetDeviceCount(&count));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("devices: %d; device 0: %s, %zu MiB, compute capability %d.%d\n", count, prop.name,
                prop.totalGlobalMem >> 20, prop.major, prop.minor);

    // The vector add, on fresh random inputs, checked element by element.
    const size_t n = size_t(1) << 24;
    std::vector<float> a(n), b(n), c(n, std::nanf(""));
    std::srand(12345);
    for (size_t i = 0; i < n; i++) {
        a[i] = float(std::rand()) / RAND_MAX;
        b[i] = float(std::rand()) / RAND_MAX;
    }
    float *da, *db, *dc;
    CHECK(cudaMalloc(&da, n * sizeof(float)));
    CHECK(cudaMalloc(&db, n * sizeof(float)));
    CHECK(cudaMalloc(&dc, n * sizeof(float)));
    CHECK(cudaMemcpy(da, a.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(db, b.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemset(dc, 0xff, n * sizeof(float)));
    auto start = std::chrono::steady_clock::now();
    add<<<(unsigned)((n + 255) / 256), 256>>>(da, db, dc, n);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    double kernel = seconds_since(start);
    CHECK(cudaMemcpy(c.data(), dc, n * sizeof(float), cudaMemcpyDeviceToHost));
    size_t wrong = 0;
    for (size_t i = 0; i < n; i++) {
        if (!(std::fabs(c[i] - (a[i] + b[i])) <= 1e-6f)) wrong++;
    }
    std::printf("vector add: %zu elements, %zu wrong, kernel and sync %.3f ms\n", n, wrong,
                kernel * 1e3);

    // 256 MiB there and back (pageable host memory, as most programs have it), compared.
    const size_t bytes = size_t(256) << 20;
    std::vector<unsigned char> out(bytes), back(bytes, 0);
    for (size_t i = 0; i < bytes; i++) out[i] = (unsigned char)(std::rand() >> 7);
    unsigned char *d;
    CHECK(cudaMalloc(&d, bytes));
    CHECK(cudaMemcpy(d, out.data(), bytes, cudaMemcpyHostToDevice)); // warm-up
    start = std::chrono::steady_clock::now();
    CHECK(cudaMemcpy(d, out.data(), bytes, cudaMemcpyHostToDevice));
    CHECK(cudaDeviceSynchronize());
    double h2d = seconds_since(start);
    start = std::chrono::steady_clock::now();
    CHECK(cudaMemcpy(back.data(), d, bytes, cudaMemcpyDeviceToHost));
    double d2h = seconds_since(start);
    bool same = std::memcmp(out.data(), back.data(), bytes) == 0;
    std::printf("copy 256 MiB: host to device %.3f s (%.2f GB/s), device to host %.3f s "
                "(%.2f GB/s), %s\n",
                h2d, bytes / h2d / 1e9, d2h, bytes / d2h / 1e9,
                same ? "identical" : "DIFFERENT");
    CHECK(cudaFree(d));
    CHECK(cudaFree(da));
    CHECK(cudaFree(db));
    CHECK(cudaFree(dc));
    if (wrong != 0 || !same) {
        std::printf("FAILED\n");
        return 1;
    }
    std::printf("OK\n");
    return 0;
}
