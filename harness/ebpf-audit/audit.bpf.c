// The lifecycle audit's kernel side: the syscalls of one process tree, as events in a ring
// buffer, without stopping a thread. The user side (orchestration/ebpf) decides which
// syscalls count and what memory each one's event carries, and renders the events as the
// strace lines the checker reads.
//
// Built by build.rs with `clang -target bpf`; it needs no kernel headers. Every program is a
// raw tracepoint: the kernel calls it with the tracepoint's own arguments, and a detach frees
// it after an RCU grace period in the background. A perf-event tracepoint (the older kind)
// waits out that grace period in every detach, under a mutex all the machine's tracers share:
// seven of them cost each rank a quarter of a second at its end. What the arguments point
// into is read at fixed ABI offsets (the syscall registers) or by CO-RE relocations against
// the running kernel's BTF (a task's pid, an io_uring request's opcode and result).

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;
typedef long long __s64;
typedef int __s32;

#define SEC(name) __attribute__((section(name), used))
#define __uint(name, val) int (*name)[val]
#define __type(name, val) typeof(val) *name

enum { BPF_MAP_TYPE_HASH = 1, BPF_MAP_TYPE_ARRAY = 2, BPF_MAP_TYPE_RINGBUF = 27 };
enum { BPF_ANY = 0 };
enum { BPF_RB_NO_WAKEUP = 1, BPF_RB_FORCE_WAKEUP = 2, BPF_RB_AVAIL_DATA = 0 };

// The reader is woken only once this much is waiting (it also drains every few ms): a wakeup
// per event would cost the traced program a context switch per syscall.
#define WAKE_AT (256 << 10)

// Helper numbers are the kernel's stable ABI (include/uapi/linux/bpf.h).
static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)1;
static long (*bpf_map_update_elem)(void *map, const void *key, const void *value, __u64 flags) = (void *)2;
static long (*bpf_map_delete_elem)(void *map, const void *key) = (void *)3;
static __u64 (*bpf_ktime_get_ns)(void) = (void *)5;
static __u64 (*bpf_get_current_pid_tgid)(void) = (void *)14;
static long (*bpf_probe_read_user)(void *dst, __u32 size, const void *src) = (void *)112;
static long (*bpf_probe_read_user_str)(void *dst, __u32 size, const void *src) = (void *)114;
static void *(*bpf_ringbuf_reserve)(void *ringbuf, __u64 size, __u64 flags) = (void *)131;
static __u64 (*bpf_ringbuf_query)(void *ringbuf, __u64 flags) = (void *)134;
static void (*bpf_ringbuf_submit)(void *data, __u64 flags) = (void *)132;
static long (*bpf_probe_read_kernel)(void *dst, __u32 size, const void *src) = (void *)113;

// Where a syscall's arguments and number are in the `struct pt_regs` the syscall tracepoints
// pass: the kernel's layout, the same as ptrace's (uapi asm/ptrace.h). build.rs says which
// architecture.
// The registers are read in one copy of the window [ARGS_FROM, ARGS_FROM + 64), then picked.
#if defined(WRINGER_ARCH_x86_64)
#define ARGS_FROM 56
static const __u32 ARG_AT[6] = {56, 48, 40, 0, 16, 8}; // di, si, dx, r10, r8, r9
#define NR_AT 120                                       // orig_ax
#define NR_SIZE 8
#define NR_PRCTL 157
#define NR_EXECVE 59
#define NR_EXECVEAT 322
#elif defined(WRINGER_ARCH_aarch64)
// At entry x0 still holds the first argument (orig_x0 keeps it once x0 holds the result).
#define ARGS_FROM 0
static const __u32 ARG_AT[6] = {0, 8, 16, 24, 32, 40}; // x0..x5
#define NR_AT 280                                       // syscallno
#define NR_SIZE 4
#define NR_PRCTL 167
#define NR_EXECVE 221
#define NR_EXECVEAT 281
#else
#error "the eBPF audit knows the syscall registers of x86_64 and aarch64 only"
#endif

// A raw tracepoint's arguments, as its TP_PROTO declares them.
struct raw_args {
    __u64 args[0];
};

// Only the fields read, relocated by offset to the running kernel's layout (CO-RE).
struct task_struct {
    int pid;
} __attribute__((preserve_access_index));

struct io_cqe {
    __u64 user_data;
    int res;
} __attribute__((preserve_access_index));

struct io_kiocb {
    __u8 opcode;
    struct io_cqe cqe;
} __attribute__((preserve_access_index));

#define CAPTURE 128
#define SYSCALLS 512

enum kind { ENTER = 0, EXIT = 1, THREAD_EXIT = 2, URING_OP = 3, URING_DONE = 4 };
enum when { NEVER = 0, AT_ENTER = 1, AT_EXIT = 2 };

// What one syscall's event carries besides its arguments: up to two reads of user memory,
// each from a pointer argument, at entry or at return.
struct capture {
    __u8 when[2];
    __u8 arg[2];
    // Bytes to read; when len_arg < 6, at most args[len_arg] * len_mul of them.
    __u16 len[2];
    __u8 len_arg[2];
    __u8 len_mul[2];
    // Read a NUL-terminated string rather than bytes.
    __u8 string[2];
    __u8 wanted;
    __u8 pad;
};

struct event {
    __u64 ts;
    __u32 tid;
    __u32 tgid;
    __u32 kind;
    __s32 id;
    __u64 args[6];
    __s64 ret;
    __u32 cap_len[2];
    __u8 cap[2][CAPTURE];
    // Where the program called it from (the sync observer's slot), or 0.
    __u64 site;
};

// Processes whose syscalls are recorded (tgid -> 1), and the tracer's own (tgid -> 2): its
// children join the first set when they are forked, and it is not recorded itself.
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 65536);
    __type(key, __u32);
    __type(value, __u8);
} traced SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, SYSCALLS);
    __type(key, __u32);
    __type(value, struct capture);
} captures SEC(".maps");

// A thread's arguments at entry, kept until return for the reads made then (pipe2's fds).
struct args {
    __u64 v[6];
};

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 65536);
    __type(key, __u32);
    __type(value, struct args);
} entered SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_RINGBUF);
    __uint(max_entries, 16 << 20);
} events SEC(".maps");

// [0]: events dropped because the ring buffer was full; [1]: user reads that failed.
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 2);
    __type(key, __u32);
    __type(value, __u64);
} lost SEC(".maps");

// A thread that spins on a non-blocking call: the same syscall on the same descriptor failing
// with EAGAIN again and again (a polling receive loop) would fill the ring on two cores. Such
// a repeat is folded: neither its entry nor its exit is recorded, and the next call that ends
// otherwise is recorded whole (entry and exit, both at its return). The checker loses nothing
// it judges by: the first such call is recorded, and so is the one that ends the spin.
#define EAGAIN 11
struct spin {
    __s32 id;
    __u32 again;    // the thread's last call failed with EAGAIN
    __u64 fd;       // its first argument
    __u32 skipping; // the call in progress is a folded repeat
    __u32 pad;
    __u64 folded;   // repeats folded so far
};

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 65536);
    __type(key, __u32);
    __type(value, struct spin);
} spinning SEC(".maps");

// io_uring requests a traced process submitted, until they complete: req -> who and what. An
// operation in flight on a descriptor is a use of it that no syscall shows (the submitting
// call returned long ago), so a close then is a close while in use.
struct uring_req {
    __u64 pid_tgid;
    __u64 opcode;
};

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 65536);
    __type(key, __u64);
    __type(value, struct uring_req);
} uring SEC(".maps");

// Each observed thread's call-site slot (the sync observer's `struct call_site`, told by its
// SYNC_SITE_SLOT marker): tid -> its address in the thread's process. Dropped at the thread's
// end and at an execve, so a reused tid never reads another program's memory.
#define SYNC_MARKER 0x57534e43
#define SYNC_SITE_SLOT 9
struct call_site {
    __u64 site;
    __u64 first;
};

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 65536);
    __type(key, __u32);
    __type(value, __u64);
} site_slots SEC(".maps");

// The site of the call the thread is in, when its slot names a call whose first argument is
// this syscall's (else a raw syscall made meanwhile, by a signal handler say, would take it).
static __attribute__((always_inline)) __u64 site_of(__u32 me, __u64 first) {
    __u64 *slot = bpf_map_lookup_elem(&site_slots, &me);
    if (!slot)
        return 0;
    struct call_site cs = {0};
    if (bpf_probe_read_user(&cs, sizeof cs, (void *)*slot) < 0)
        return 0;
    return (__u32)cs.first == (__u32)first ? cs.site : 0;
}

// The slot's bookkeeping, at a syscall's entry: told by a marker, forgotten at an execve.
static __attribute__((always_inline)) void keep_slot(__u32 me, long id, __u64 *args) {
    if (id == NR_PRCTL && args[0] == SYNC_MARKER && args[1] == SYNC_SITE_SLOT)
        bpf_map_update_elem(&site_slots, &me, &args[2], BPF_ANY);
    else if (id == NR_EXECVE || id == NR_EXECVEAT)
        bpf_map_delete_elem(&site_slots, &me);
}

static void count_lost(__u32 which) {
    __u64 *n = bpf_map_lookup_elem(&lost, &which);
    if (n)
        __sync_fetch_and_add(n, 1);
}

static int recorded(__u32 tgid) {
    __u8 *t = bpf_map_lookup_elem(&traced, &tgid);
    return t && *t == 1;
}

static void read_capture(struct event *e, struct capture *c, int i, __u8 when) {
    if (c->when[i] != when)
        return;
    __u32 a = c->arg[i];
    if (a > 5)
        return;
    __u64 ptr = e->args[a];
    __u64 n = c->len[i];
    if (c->len_arg[i] < 6) {
        __u64 max = e->args[c->len_arg[i] & 7] * c->len_mul[i];
        if (max < n)
            n = max;
    }
    if (n > CAPTURE)
        n = CAPTURE;
    // Hide n's origin from clang, so that the verifier sees the bound on the register the
    // read is given (clang otherwise reuses the unbounded copy).
    asm volatile("" : "+r"(n));
    if (n == 0 || n > CAPTURE || ptr == 0)
        return;
    long r;
    if (c->string[i])
        r = bpf_probe_read_user_str(e->cap[i & 1], n, (void *)ptr);
    else
        r = bpf_probe_read_user(e->cap[i & 1], n, (void *)ptr);
    if (r < 0) {
        count_lost(1);
        return;
    }
    e->cap_len[i & 1] = c->string[i] ? (__u32)r : n;
}

// The six arguments of the syscall `regs` entered with, in one read of kernel memory.
static __attribute__((always_inline)) void syscall_args(void *regs, __u64 *out) {
    __u64 window[8] = {0};
    bpf_probe_read_kernel(window, sizeof window, (char *)regs + ARGS_FROM);
    for (int i = 0; i < 6; i++)
        out[i] = window[(ARG_AT[i] / 8) & 7];
}

// An event for the current thread, reserved and filled in but for what entry and return add;
// NULL when the ring buffer is full (counted).
static __attribute__((always_inline)) struct event *reserve(__u64 pid_tgid, __u32 kind, __s32 id) {
    struct event *e = bpf_ringbuf_reserve(&events, sizeof(struct event), 0);
    if (!e) {
        count_lost(0);
        return 0;
    }
    e->ts = bpf_ktime_get_ns();
    e->tid = (__u32)pid_tgid;
    e->tgid = pid_tgid >> 32;
    e->kind = kind;
    e->id = id;
    e->ret = 0;
    e->cap_len[0] = 0;
    e->cap_len[1] = 0;
    e->site = 0;
    for (int i = 0; i < 6; i++)
        e->args[i] = 0;
    return e;
}

// The capture entry of syscall `id` when a traced process makes it and it is recorded.
static __attribute__((always_inline)) struct capture *wanted(__u64 pid_tgid, long sysid) {
    if (!recorded(pid_tgid >> 32))
        return 0;
    __u32 id = sysid;
    if (id >= SYSCALLS)
        return 0;
    struct capture *c = bpf_map_lookup_elem(&captures, &id);
    return c && c->wanted ? c : 0;
}

static __attribute__((always_inline)) void submit(struct event *e) {
    __u64 flags = bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) >= WAKE_AT ? BPF_RB_FORCE_WAKEUP
                                                                         : BPF_RB_NO_WAKEUP;
    bpf_ringbuf_submit(e, flags);
}

static __attribute__((always_inline)) int read_at_exit(struct capture *c) {
    return c->when[0] == AT_EXIT || c->when[1] == AT_EXIT;
}

SEC("raw_tracepoint/sys_enter")
int on_enter(struct raw_args *ctx) {
    __u64 pid_tgid = bpf_get_current_pid_tgid();
    long id = (long)ctx->args[1];
    struct capture *c = wanted(pid_tgid, id);
    if (!c)
        return 0;
    struct args a;
    syscall_args((void *)ctx->args[0], a.v);
    __u32 me = (__u32)pid_tgid;
    keep_slot(me, id, a.v);
    struct spin *sp = bpf_map_lookup_elem(&spinning, &me);
    if (!sp) {
        struct spin fresh = {0};
        fresh.id = -1;
        bpf_map_update_elem(&spinning, &me, &fresh, BPF_ANY);
        sp = bpf_map_lookup_elem(&spinning, &me);
    }
    if (sp) {
        sp->skipping = sp->again && sp->id == (__s32)id && sp->fd == a.v[0];
        if (!sp->skipping) {
            sp->id = (__s32)id;
            sp->fd = a.v[0];
            sp->again = 0;
        }
        if (sp->skipping) {
            // Kept for the exit, which records the whole call if it ends the spin.
            bpf_map_update_elem(&entered, &me, &a, BPF_ANY);
            return 0;
        }
    }
    struct event *e = reserve(pid_tgid, ENTER, id);
    if (!e)
        return 0;
    for (int i = 0; i < 6; i++)
        e->args[i] = a.v[i];
    e->site = site_of(me, a.v[0]);
    read_capture(e, c, 0, AT_ENTER);
    read_capture(e, c, 1, AT_ENTER);
    if (read_at_exit(c))
        bpf_map_update_elem(&entered, &me, &a, BPF_ANY);
    submit(e);
    return 0;
}

SEC("raw_tracepoint/sys_exit")
int on_exit(struct raw_args *ctx) {
    __u64 pid_tgid = bpf_get_current_pid_tgid();
    long ret = (long)ctx->args[1];
    long id = 0;
    bpf_probe_read_kernel(&id, NR_SIZE, (char *)ctx->args[0] + NR_AT);
    id = NR_SIZE == 4 ? (long)(__s32)id : id;
    struct capture *c = wanted(pid_tgid, id);
    if (!c)
        return 0;
    __u32 me = (__u32)pid_tgid;
    struct spin *sp = bpf_map_lookup_elem(&spinning, &me);
    int again = ret == -EAGAIN;
    if (sp && sp->skipping) {
        sp->skipping = 0;
        if (again) {
            sp->folded++;
            return 0;
        }
        // The spin ends: record this call's entry now, from the arguments kept at entry.
        struct args *kept = bpf_map_lookup_elem(&entered, &me);
        struct event *in = reserve(pid_tgid, ENTER, id);
        if (in) {
            if (kept)
                for (int i = 0; i < 6; i++)
                    in->args[i] = kept->v[i];
            in->site = site_of(me, in->args[0]);
            read_capture(in, c, 0, AT_ENTER);
            read_capture(in, c, 1, AT_ENTER);
            submit(in);
        }
    }
    if (sp)
        sp->again = again;
    struct event *e = reserve(pid_tgid, EXIT, id);
    if (!e)
        return 0;
    e->ret = ret;
    if (read_at_exit(c)) {
        struct args *at = bpf_map_lookup_elem(&entered, &me);
        if (at) {
            for (int i = 0; i < 6; i++)
                e->args[i] = at->v[i];
            bpf_map_delete_elem(&entered, &me);
            if (ret >= 0) {
                read_capture(e, c, 0, AT_EXIT);
                read_capture(e, c, 1, AT_EXIT);
            }
        }
    }
    submit(e);
    return 0;
}

// sched_process_fork(parent, child), run in the parent.
SEC("raw_tracepoint/sched_process_fork")
int on_fork(struct raw_args *ctx) {
    // What counts is the parent's process.
    __u32 tgid = bpf_get_current_pid_tgid() >> 32;
    __u8 *t = bpf_map_lookup_elem(&traced, &tgid);
    if (!t)
        return 0;
    struct task_struct *task = (void *)ctx->args[1];
    __u32 child = 0;
    bpf_probe_read_kernel(&child, 4, &task->pid);
    // A new thread shares its process's entry; a new process gets its own.
    __u8 one = 1;
    if (bpf_map_lookup_elem(&traced, &child) == 0)
        bpf_map_update_elem(&traced, &child, &one, BPF_ANY);
    return 0;
}

// sched_process_exit(task, ...), run in the task that ends.
SEC("raw_tracepoint/sched_process_exit")
int on_task_exit(struct raw_args *ctx) {
    __u64 pid_tgid = bpf_get_current_pid_tgid();
    if (!recorded(pid_tgid >> 32))
        return 0;
    __u32 tid = (__u32)pid_tgid;
    bpf_map_delete_elem(&entered, &tid);
    bpf_map_delete_elem(&spinning, &tid);
    bpf_map_delete_elem(&site_slots, &tid);
    struct event *e = reserve(pid_tgid, THREAD_EXIT, -1);
    if (e)
        submit(e);
    return 0;
}

// io_uring_submit_req(req), run in the submitter.
SEC("raw_tracepoint/io_uring_submit_req")
int on_uring_submit(struct raw_args *ctx) {
    __u64 pid_tgid = bpf_get_current_pid_tgid();
    if (!recorded(pid_tgid >> 32))
        return 0;
    struct io_kiocb *req = (void *)ctx->args[0];
    __u8 opcode = 0;
    bpf_probe_read_kernel(&opcode, 1, &req->opcode);
    __u64 key = (__u64)req;
    struct uring_req r = {pid_tgid, opcode};
    bpf_map_update_elem(&uring, &key, &r, BPF_ANY);
    return 0;
}

// io_uring_file_get(req, fd): the request takes its descriptor (not for registered files): it
// is in flight on it from now.
SEC("raw_tracepoint/io_uring_file_get")
int on_uring_file(struct raw_args *ctx) {
    __u64 req = ctx->args[0];
    struct uring_req *r = bpf_map_lookup_elem(&uring, &req);
    if (!r)
        return 0;
    __s32 fd = (__s32)ctx->args[1];
    struct event *e = reserve(r->pid_tgid, URING_OP, -1);
    if (!e)
        return 0;
    e->args[0] = req;
    e->args[1] = (__u64)(__s64)fd;
    e->args[2] = r->opcode;
    submit(e);
    return 0;
}

// io_uring_complete(ctx, req, ...): its completion, in whatever context it runs (a worker,
// task work), told as its submitter's. The result is the request's own (req->cqe.res), which
// every kernel with these tracepoints passes on, whatever the tracepoint's later arguments.
SEC("raw_tracepoint/io_uring_complete")
int on_uring_done(struct raw_args *ctx) {
    __u64 key = ctx->args[1];
    struct uring_req *r = bpf_map_lookup_elem(&uring, &key);
    if (!r)
        return 0;
    struct io_kiocb *req = (void *)key;
    __s32 res = 0;
    bpf_probe_read_kernel(&res, 4, &req->cqe.res);
    struct event *e = reserve(r->pid_tgid, URING_DONE, -1);
    if (e) {
        e->args[0] = key;
        e->ret = res;
        submit(e);
    }
    bpf_map_delete_elem(&uring, &key);
    return 0;
}

char LICENSE[] SEC("license") = "GPL";
