// LD_PRELOAD shim: reports another GPU's device attributes to the CUDA driver's callers, so that
// cuBLASLt's heuristic (a function of the problem and of the device's attributes, run on the host) answers
// as it does on that GPU. tools/as_h200.sh builds it and gives the H200's attributes; SPOOF_LOG=PREFIX
// writes each attribute asked (once per process) to PREFIX.<pid>.
// Intercepts dlsym (how a statically linked CUDA runtime finds libcuda's entry points) and
// cuGetProcAddress, wraps cuDeviceGetAttribute, cuDeviceTotalMem and cuDeviceGetName.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
static int (*real_attr)(int *, int, CUdevice);
static CUresult (*real_totalmem)(size_t *, CUdevice);
static CUresult (*real_name)(char *, int, CUdevice);
static CUresult (*real_gpa)(const char *, void **, int, uint64_t);
static CUresult (*real_gpa2)(const char *, void **, int, uint64_t, void *);
static void *(*real_dlsym)(void *, const char *);

// attribute -> value, from SPOOF_ATTRS="13=1980000,36=3201000,..."
static int n_over = -1, over_k[64], over_v[64];
static long long spoof_mem = -1;
static char spoof_name[256];
static FILE *logf;
static unsigned char seen[512];

static void load(void) {
    if (n_over >= 0) return;
    n_over = 0;
    const char *s = getenv("SPOOF_ATTRS");
    while (s && *s && n_over < 64) {
        int k, v, n;
        if (sscanf(s, "%d=%d%n", &k, &v, &n) != 2) break;
        over_k[n_over] = k; over_v[n_over++] = v;
        s += n; if (*s == ',') s++;
    }
    const char *m = getenv("SPOOF_TOTAL_MEM"); if (m) spoof_mem = atoll(m);
    const char *nm = getenv("SPOOF_NAME"); if (nm) snprintf(spoof_name, sizeof spoof_name, "%s", nm);
    const char *lg = getenv("SPOOF_LOG");
    if (lg) { char p[512]; snprintf(p, sizeof p, "%s.%d", lg, (int)getpid()); logf = fopen(p, "w"); }
}

static CUresult my_attr(int *pi, int attrib, CUdevice dev) {
    load();
    CUresult r = real_attr(pi, attrib, dev);
    int before = *pi;
    if (r == 0) for (int i = 0; i < n_over; i++) if (over_k[i] == attrib) *pi = over_v[i];
    if (logf && attrib >= 0 && attrib < 512 && !seen[attrib]) {
        seen[attrib] = 1; fprintf(logf, "attr %d %d -> %d\n", attrib, before, *pi); fflush(logf);
    }
    return r;
}
static CUresult my_totalmem(size_t *b, CUdevice dev) {
    load();
    CUresult r = real_totalmem(b, dev);
    if (logf) { fprintf(logf, "totalmem %zu -> %lld\n", *b, spoof_mem); fflush(logf); }
    if (r == 0 && spoof_mem > 0) *b = (size_t)spoof_mem;
    return r;
}
static CUresult my_name(char *n, int len, CUdevice dev) {
    load();
    CUresult r = real_name(n, len, dev);
    if (logf) { fprintf(logf, "name %s -> %s\n", n, spoof_name); fflush(logf); }
    if (r == 0 && spoof_name[0] && len > 0) snprintf(n, len, "%s", spoof_name);
    return r;
}
static void *wrap(const char *sym, void *p) {
    if (!p || !sym) return p;
    if (!strcmp(sym, "cuDeviceGetAttribute")) { real_attr = p; return (void *)my_attr; }
    if (!strcmp(sym, "cuDeviceTotalMem") || !strcmp(sym, "cuDeviceTotalMem_v2")) { real_totalmem = p; return (void *)my_totalmem; }
    if (!strcmp(sym, "cuDeviceGetName")) { real_name = p; return (void *)my_name; }
    return p;
}
static CUresult my_gpa(const char *sym, void **pfn, int ver, uint64_t flags);
static CUresult my_gpa2(const char *sym, void **pfn, int ver, uint64_t flags, void *st);
static void *wrap_gpa(const char *sym, void *p) {
    if (!p || !sym) return p;
    if (!strcmp(sym, "cuGetProcAddress")) { if (p != (void *)my_gpa) real_gpa = p; return (void *)my_gpa; }
    if (!strcmp(sym, "cuGetProcAddress_v2")) { real_gpa2 = p; return (void *)my_gpa2; }
    return wrap(sym, p);
}
static CUresult my_gpa(const char *sym, void **pfn, int ver, uint64_t flags) {
    CUresult r = real_gpa(sym, pfn, ver, flags);
    if (r == 0 && pfn) *pfn = wrap_gpa(sym, *pfn);
    return r;
}
static CUresult my_gpa2(const char *sym, void **pfn, int ver, uint64_t flags, void *st) {
    CUresult r = real_gpa2(sym, pfn, ver, flags, st);
    if (r == 0 && pfn) *pfn = wrap_gpa(sym, *pfn);
    return r;
}
// dlsym(RTLD_NEXT, sym) for the caller, not for the shim: the first definition in an object loaded after
// the caller's (glibc would take the shim as the caller, since the call comes from here).
static void *next_after(const void *caller, const char *sym) {
    Dl_info info;
    struct link_map *lm = NULL;
    if (!dladdr1(caller, &info, (void **)&lm, RTLD_DL_LINKMAP) || !lm) return real_dlsym(RTLD_NEXT, sym);
    for (struct link_map *o = lm->l_next; o; o = o->l_next) {
        if (!o->l_name || !o->l_name[0]) continue;
        void *h = dlopen(o->l_name, RTLD_LAZY | RTLD_NOLOAD);
        if (!h) continue;
        void *p = real_dlsym(h, sym);
        struct link_map *at = NULL;
        int here = p && dladdr1(p, &info, (void **)&at, RTLD_DL_LINKMAP) && at == o;
        dlclose(h);
        if (here) return p;
    }
    return NULL;
}
void *dlsym(void *h, const char *sym) {
    if (!real_dlsym) {
        real_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
        if (!real_dlsym) real_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    }
    void *p = h == RTLD_NEXT ? next_after(__builtin_return_address(0), sym) : real_dlsym(h, sym);
    return wrap_gpa(sym, p);
}
