/*
 * What the stand-in driver (standin_cuda.c) exposes to tests besides the CUDA driver API: its
 * own bookkeeping, so a test can tell what really reached "the driver".
 */
#ifndef GSAAS_STANDIN_H
#define GSAAS_STANDIN_H

/* Device bytes (allocations, managed, VMM physical) this process holds in the stand-in. */
unsigned long long gsaas_standin_device_used(void);
/* Page-locked host bytes (host allocations and registrations) this process holds. */
unsigned long long gsaas_standin_pinned_used(void);
/* How many times the exported function `name` was entered in this process. */
unsigned long long gsaas_standin_calls(const char *name);
/* How many times a function was entered through a pointer cuGetProcAddress handed out in
 * GSAAS_STANDIN_PROC_INTERNAL=1 mode (an address that is no exported symbol). */
unsigned long long gsaas_standin_internal_calls(void);

#endif /* GSAAS_STANDIN_H */
