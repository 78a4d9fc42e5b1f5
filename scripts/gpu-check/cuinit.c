/* GSaaS's GPU check, self-test half (scripts/gpu-check.sh selftest): loads libcuda.so.1 (LUPINE's
 * client, by LD_LIBRARY_PATH) and makes the first driver calls, which make the client connect
 * to every server in LUPINE_SERVER. Against a stand-in server the calls fail; what the self-test
 * checks is that the connection reached the stand-in through the VM's masked endpoint. */
#include <dlfcn.h>
#include <stdio.h>

#include <cuda.h>

int main(void) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (!cuda) {
        fprintf(stderr, "cannot load libcuda.so.1: %s\n", dlerror());
        return 2;
    }
    CUresult (*init)(unsigned int) = (CUresult(*)(unsigned int))dlsym(cuda, "cuInit");
    CUresult (*count)(int *) = (CUresult(*)(int *))dlsym(cuda, "cuDeviceGetCount");
    if (!init || !count) {
        fprintf(stderr, "libcuda.so.1 lacks cuInit or cuDeviceGetCount\n");
        return 2;
    }
    CUresult r = init(0);
    int devices = -1;
    CUresult c = count(&devices);
    printf("cuInit: %d, cuDeviceGetCount: %d (%d devices)\n", (int)r, (int)c, devices);
    return r == CUDA_SUCCESS ? 0 : 1;
}
