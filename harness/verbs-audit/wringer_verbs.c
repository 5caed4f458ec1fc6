/*
 * wringer's verbs observer: preloaded (LD_PRELOAD) into a program that uses libibverbs and
 * librdmacm, it writes a per-process trace of verbs object lifecycles, posts and completions,
 * which the harness checks (harness/src/orchestration/verbs_audit.rs). No rebuild of the
 * program is needed.
 *
 * - Lifecycles: the exported create/destroy functions are interposed (ibv_*, rdma_*).
 * - The data path is inline in verbs.h: ibv_post_send/post_recv/poll_cq call through the
 *   context's ops table, and the extended API (ibv_wr_*, ibv_start_poll) through function
 *   pointers in each ibv_qp_ex / ibv_cq_ex. Those pointers are replaced, when the context or
 *   object is first seen, with wrappers that record and call the original.
 * - One line per event, written with one write(2) to an O_APPEND file: a crash loses nothing
 *   already returned from. Posts are written before the call (so a completion polled on
 *   another thread never precedes its post), and a failed post says so on a second line.
 * - Bounded: past WRINGER_VERBS_TRACE_MAX bytes (default 64 MiB) posts and completions stop
 *   being written (the trace says so, and the checker stops the checks that need them);
 *   lifecycle lines go on, within a reserve.
 *
 * - A program may load libibverbs itself, dlopen(RTLD_LOCAL) and dlsym on that handle (sideway's
 *   rdma-mummy-sys does), which no preload reaches. dlopen is interposed for libibverbs and
 *   librdmacm: the caller gets this library's handle instead, whose lookups find these
 *   wrappers first and the real libraries (this library's dependencies) for the rest.
 *
 * The trace goes to $WRINGER_VERBS_TRACE.<pid>.verbs, opened at the first event, so processes
 * that never touch verbs (a shell the program starts) leave no file.
 *
 * The `qp-error` fault: once a process has a QP, a thread watches for the file
 * $WRINGER_VERBS_TRACE.qp-error; when the harness creates it, every live QP of the process is
 * moved to the error state (through ibv_modify_qp, so the trace shows it), once.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <malloc.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#undef ibv_reg_mr
#undef ibv_reg_mr_iova

#define EXPORT __attribute__((visibility("default")))
#define LIFECYCLE 0
#define DATA 1
#define RESERVE (1ul << 20)

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int trace_fd = -1;
static int trace_failed;
static pid_t trace_pid;
static atomic_ulong written;
static atomic_int data_stopped, all_stopped;
static unsigned long cap = 64ul << 20;
static atomic_ulong call_seq;
static __thread long my_tid;
static __thread int named;
static __thread int depth; /* >0 inside an interposed call that may call another one */

static long tid(void)
{
	if (!my_tid)
		my_tid = syscall(SYS_gettid);
	return my_tid;
}

/* Open the trace at the first event (and again in a forked child, which has its own pid). */
static int trace(void)
{
	pid_t pid = getpid();
	if (trace_fd >= 0 && trace_pid == pid)
		return trace_fd;
	pthread_mutex_lock(&lock);
	if ((trace_fd < 0 || trace_pid != pid) && !trace_failed) {
		const char *prefix = getenv("WRINGER_VERBS_TRACE");
		const char *max = getenv("WRINGER_VERBS_TRACE_MAX");
		if (max && atol(max) > (long)(2 * RESERVE))
			cap = (unsigned long)atol(max);
		if (!prefix || !*prefix) {
			trace_failed = 1;
		} else {
			char path[4096], exe[512] = "?", head[1024];
			snprintf(path, sizeof path, "%s.%d.verbs", prefix, (int)pid);
			if (trace_fd >= 0)
				close(trace_fd); /* the parent's, inherited by fork */
			trace_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
			trace_pid = pid;
			written = 0;
			named = 0;
			data_stopped = all_stopped = 0;
			ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
			exe[n > 0 ? n : 1] = 0;
			int len = snprintf(head, sizeof head, "wringer-verbs 1 pid=%d exe=%s cap=%lu\n",
					   (int)pid, exe, cap);
			if (trace_fd >= 0 && write(trace_fd, head, len) < 0)
				trace_failed = 1;
		}
	}
	pthread_mutex_unlock(&lock);
	return trace_pid == pid ? trace_fd : -1;
}

/* One event: "<unix seconds.micros> <tid> <event> key=value...". */
__attribute__((format(printf, 2, 3))) static void emit(int data, const char *fmt, ...)
{
	int fd = trace();
	if (fd < 0 || all_stopped)
		return;
	char buf[2048];
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	int n = snprintf(buf, sizeof buf, "%ld.%06ld %ld ", (long)ts.tv_sec, ts.tv_nsec / 1000, tid());
	va_list ap;
	va_start(ap, fmt);
	n += vsnprintf(buf + n, sizeof buf - n - 1, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof buf - 2)
		n = sizeof buf - 2;
	buf[n++] = '\n';
	unsigned long limit = data ? cap - RESERVE : cap;
	if (atomic_load(&written) + n > limit) {
		atomic_int *flag = data ? &data_stopped : &all_stopped;
		if (!atomic_exchange(flag, 1)) {
			char note[128];
			int m = snprintf(note, sizeof note, "%ld.%06ld %ld truncated what=%s at=%lu\n",
					 (long)ts.tv_sec, ts.tv_nsec / 1000, tid(),
					 data ? "data" : "all", atomic_load(&written));
			if (write(fd, note, m) < 0)
				return;
		}
		return;
	}
	if (!named) {
		/* The thread's name, once, before its first event: evidence names threads. */
		char name[32] = "?", line[128];
		named = 1;
		pthread_getname_np(pthread_self(), name, sizeof name);
		int m = snprintf(line, sizeof line, "%ld.%06ld %ld thread name=%s\n", (long)ts.tv_sec,
				 ts.tv_nsec / 1000, tid(), name);
		atomic_fetch_add(&written, m);
		if (write(fd, line, m) < 0)
			return;
	}
	atomic_fetch_add(&written, n);
	if (write(fd, buf, n) < 0)
		return;
}

#define REAL(ret, name, ...)                                                       \
	static ret (*real_##name)(__VA_ARGS__);                                    \
	if (!real_##name)                                                          \
		real_##name = (ret(*)(__VA_ARGS__))resolve(#name);

/* The real function, next after this library in the global scope (libibverbs and librdmacm
 * are this library's dependencies, so they are there). Without it there is nothing to call. */
static void *resolve(const char *name)
{
	void *fn = dlsym(RTLD_NEXT, name);
	if (!fn) {
		char msg[160];
		int n = snprintf(msg, sizeof msg, "wringer verbs observer: no real %s to call\n", name);
		if (write(2, msg, n) < 0)
			abort();
		abort();
	}
	return fn;
}

/* ---- pointer-keyed tables of the originals of replaced function pointers ---- */

#define SLOTS 8192
struct slot {
	const void *key;
	void *fn[8];
};
struct table {
	struct slot s[SLOTS];
};
static struct table contexts, qps, cqs;

/* The slot of `key` (made when `make`), or NULL. Callers hold `lock`. */
static struct slot *slot_of(struct table *t, const void *key, int make)
{
	size_t h = ((uintptr_t)key >> 4) * 0x9e3779b97f4a7c15ull >> 51;
	for (size_t i = 0; i < SLOTS; i++) {
		struct slot *s = &t->s[(h + i) % SLOTS];
		if (s->key == key)
			return s;
		if (!s->key) {
			if (!make)
				return NULL;
			memset(s, 0, sizeof *s);
			s->key = key;
			return s;
		}
	}
	return NULL;
}

static void *original(struct table *t, const void *key, int i)
{
	pthread_mutex_lock(&lock);
	struct slot *s = slot_of(t, key, 0);
	void *fn = s ? s->fn[i] : NULL;
	pthread_mutex_unlock(&lock);
	return fn;
}

/* ---- MR ranges, for munmap (memory freed under a posted WR is judged by the checker) ---- */

#define MRS 16384
static struct {
	const void *mr;
	uintptr_t lo, hi;
} mrs[MRS];
/* Slots in use are below `mrs_used`; every live range lies inside [envelope_lo, envelope_hi),
 * so most frees (and unmaps) are told apart without the lock. */
static int mrs_used;
static atomic_uintptr_t envelope_lo = UINTPTR_MAX, envelope_hi;

static void mr_range(const void *mr, uintptr_t lo, size_t len)
{
	pthread_mutex_lock(&lock);
	for (int i = 0; i < MRS; i++)
		if (mrs[i].mr == mr || (!mrs[i].mr && len)) {
			mrs[i].mr = len ? mr : NULL;
			mrs[i].lo = lo;
			mrs[i].hi = lo + len;
			if (i >= mrs_used)
				mrs_used = i + 1;
			break;
		}
	if (len) {
		if (lo < atomic_load(&envelope_lo))
			atomic_store(&envelope_lo, lo);
		if (lo + len > atomic_load(&envelope_hi))
			atomic_store(&envelope_hi, lo + len);
	}
	pthread_mutex_unlock(&lock);
}

static int overlaps_mr(uintptr_t lo, size_t len)
{
	if (lo >= atomic_load(&envelope_hi) || lo + len <= atomic_load(&envelope_lo))
		return 0;
	int hit = 0;
	pthread_mutex_lock(&lock);
	for (int i = 0; i < mrs_used && !hit; i++)
		hit = mrs[i].mr && mrs[i].lo < lo + len && lo < mrs[i].hi;
	pthread_mutex_unlock(&lock);
	return hit;
}

/* ---- the data path ---- */

static void sges(char *out, size_t size, const struct ibv_sge *sg, int n)
{
	size_t at = 0;
	out[0] = 0;
	for (int i = 0; i < n && at + 64 < size; i++)
		at += snprintf(out + at, size - at, "%s0x%lx+%u/%u", i ? "," : "",
			       (unsigned long)sg[i].addr, sg[i].length, sg[i].lkey);
	if (!n)
		snprintf(out, size, "-");
}

enum { CTX_POST_SEND, CTX_POST_RECV, CTX_POLL_CQ, CTX_POST_SRQ_RECV, CTX_CREATE_QP_EX, CTX_CREATE_CQ_EX };

static int w_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	int (*orig)(struct ibv_qp *, struct ibv_send_wr *, struct ibv_send_wr **) =
		original(&contexts, qp->context, CTX_POST_SEND);
	unsigned long call = atomic_fetch_add(&call_seq, 1);
	char sg[512];
	for (struct ibv_send_wr *w = wr; w; w = w->next) {
		sges(sg, sizeof sg, w->sg_list, w->num_sge);
		emit(DATA, "post-send call=%lu qp=%p qpn=%u wr=%lu op=%d flags=%u sge=%s", call,
		     (void *)qp, qp->qp_num, (unsigned long)w->wr_id, w->opcode, w->send_flags, sg);
	}
	int ret = orig(qp, wr, bad);
	if (ret) {
		int i = 0;
		for (struct ibv_send_wr *w = wr; w && bad && w != *bad; w = w->next)
			i++;
		emit(DATA, "post-failed call=%lu qp=%p ret=%d from=%d", call, (void *)qp, ret, i);
	}
	return ret;
}

static void recv_lines(const char *what, const void *owner, uint32_t qpn, unsigned long call,
		       struct ibv_recv_wr *wr)
{
	char sg[512];
	for (struct ibv_recv_wr *w = wr; w; w = w->next) {
		sges(sg, sizeof sg, w->sg_list, w->num_sge);
		emit(DATA, "%s call=%lu %s=%p qpn=%u wr=%lu sge=%s", what, call,
		     what[5] == 's' ? "srq" : "qp", owner, qpn, (unsigned long)w->wr_id, sg);
	}
}

static int failed_from(struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	int i = 0;
	for (struct ibv_recv_wr *w = wr; w && bad && w != *bad; w = w->next)
		i++;
	return i;
}

static int w_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	int (*orig)(struct ibv_qp *, struct ibv_recv_wr *, struct ibv_recv_wr **) =
		original(&contexts, qp->context, CTX_POST_RECV);
	unsigned long call = atomic_fetch_add(&call_seq, 1);
	recv_lines("post-recv", qp, qp->qp_num, call, wr);
	int ret = orig(qp, wr, bad);
	if (ret)
		emit(DATA, "post-failed call=%lu qp=%p ret=%d from=%d", call, (void *)qp, ret,
		     failed_from(wr, bad));
	return ret;
}

static int w_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	int (*orig)(struct ibv_srq *, struct ibv_recv_wr *, struct ibv_recv_wr **) =
		original(&contexts, srq->context, CTX_POST_SRQ_RECV);
	unsigned long call = atomic_fetch_add(&call_seq, 1);
	recv_lines("post-srq-recv", srq, 0, call, wr);
	int ret = orig(srq, wr, bad);
	if (ret)
		emit(DATA, "post-failed call=%lu srq=%p ret=%d from=%d", call, (void *)srq, ret,
		     failed_from(wr, bad));
	return ret;
}

static int w_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	int (*orig)(struct ibv_cq *, int, struct ibv_wc *) = original(&contexts, cq->context, CTX_POLL_CQ);
	int got = orig(cq, n, wc);
	for (int i = 0; i < got; i++)
		emit(DATA, "wc cq=%p qpn=%u wr=%lu status=%d op=%d len=%u vendor=%u", (void *)cq,
		     wc[i].qp_num, (unsigned long)wc[i].wr_id, wc[i].status, wc[i].opcode,
		     wc[i].byte_len, wc[i].vendor_err);
	return got;
}

/* The extended CQ: a completion is current after start_poll or next_poll returns 0. */
enum { CQX_START, CQX_NEXT };

static void cqx_line(struct ibv_cq_ex *cq)
{
	emit(DATA, "wc cq=%p qpn=%u wr=%lu status=%d op=%d len=%u vendor=%u", (void *)cq,
	     cq->read_qp_num(cq), (unsigned long)cq->wr_id, cq->status, cq->read_opcode(cq),
	     cq->status == IBV_WC_SUCCESS ? cq->read_byte_len(cq) : 0, cq->read_vendor_err(cq));
}

static int w_start_poll(struct ibv_cq_ex *cq, struct ibv_poll_cq_attr *attr)
{
	int (*orig)(struct ibv_cq_ex *, struct ibv_poll_cq_attr *) = original(&cqs, cq, CQX_START);
	int ret = orig(cq, attr);
	if (!ret)
		cqx_line(cq);
	return ret;
}

static int w_next_poll(struct ibv_cq_ex *cq)
{
	int (*orig)(struct ibv_cq_ex *) = original(&cqs, cq, CQX_NEXT);
	int ret = orig(cq);
	if (!ret)
		cqx_line(cq);
	return ret;
}

/* The extended QP: WRs built between wr_start and wr_complete, kept per thread until then. */
enum { QPX_START, QPX_COMPLETE, QPX_ABORT, QPX_SEND, QPX_SEND_IMM, QPX_WRITE, QPX_WRITE_IMM, QPX_READ };
enum { QPX_SET_SGE = 0, QPX_SET_SGE_LIST = 1 }; /* in the slot's second table entry */
static struct table qps_sge;

#define BATCH 64
static __thread struct {
	int n, lost;
	struct {
		unsigned long wr;
		int op;
		unsigned flags;
		char sge[256];
	} wr[BATCH];
} batch;

static void w_wr_start(struct ibv_qp_ex *qp)
{
	void (*orig)(struct ibv_qp_ex *) = original(&qps, qp, QPX_START);
	batch.n = batch.lost = 0;
	orig(qp);
}

static void pend(struct ibv_qp_ex *qp, int op)
{
	if (batch.n == BATCH) {
		batch.lost++;
		return;
	}
	batch.wr[batch.n].wr = qp->wr_id;
	batch.wr[batch.n].op = op;
	batch.wr[batch.n].flags = qp->wr_flags;
	strcpy(batch.wr[batch.n].sge, "-");
	batch.n++;
}

#define WR_OP(name, slot, op, params, args)                                                \
	static void w_##name params                                                        \
	{                                                                                  \
		void(*orig) params = original(&qps, qp, slot);                             \
		pend(qp, op);                                                              \
		orig args;                                                                 \
	}
WR_OP(wr_send, QPX_SEND, IBV_WR_SEND, (struct ibv_qp_ex * qp), (qp))
WR_OP(wr_send_imm, QPX_SEND_IMM, IBV_WR_SEND_WITH_IMM, (struct ibv_qp_ex * qp, __be32 imm), (qp, imm))
WR_OP(wr_rdma_write, QPX_WRITE, IBV_WR_RDMA_WRITE,
      (struct ibv_qp_ex * qp, uint32_t rkey, uint64_t addr), (qp, rkey, addr))
WR_OP(wr_rdma_write_imm, QPX_WRITE_IMM, IBV_WR_RDMA_WRITE_WITH_IMM,
      (struct ibv_qp_ex * qp, uint32_t rkey, uint64_t addr, __be32 imm), (qp, rkey, addr, imm))
WR_OP(wr_rdma_read, QPX_READ, IBV_WR_RDMA_READ,
      (struct ibv_qp_ex * qp, uint32_t rkey, uint64_t addr), (qp, rkey, addr))

static void w_wr_set_sge(struct ibv_qp_ex *qp, uint32_t lkey, uint64_t addr, uint32_t len)
{
	void (*orig)(struct ibv_qp_ex *, uint32_t, uint64_t, uint32_t) =
		original(&qps_sge, qp, QPX_SET_SGE);
	if (batch.n) {
		struct ibv_sge s = {.addr = addr, .length = len, .lkey = lkey};
		sges(batch.wr[batch.n - 1].sge, sizeof batch.wr[0].sge, &s, 1);
	}
	orig(qp, lkey, addr, len);
}

static void w_wr_set_sge_list(struct ibv_qp_ex *qp, size_t n, const struct ibv_sge *list)
{
	void (*orig)(struct ibv_qp_ex *, size_t, const struct ibv_sge *) =
		original(&qps_sge, qp, QPX_SET_SGE_LIST);
	if (batch.n)
		sges(batch.wr[batch.n - 1].sge, sizeof batch.wr[0].sge, list, (int)n);
	orig(qp, n, list);
}

static int w_wr_complete(struct ibv_qp_ex *qp)
{
	int (*orig)(struct ibv_qp_ex *) = original(&qps, qp, QPX_COMPLETE);
	unsigned long call = atomic_fetch_add(&call_seq, 1);
	struct ibv_qp *base = &qp->qp_base;
	for (int i = 0; i < batch.n; i++)
		emit(DATA, "post-send call=%lu qp=%p qpn=%u wr=%lu op=%d flags=%u sge=%s", call,
		     (void *)base, base->qp_num, batch.wr[i].wr, batch.wr[i].op, batch.wr[i].flags,
		     batch.wr[i].sge);
	if (batch.lost)
		emit(DATA, "post-unrecorded call=%lu qp=%p count=%d", call, (void *)base, batch.lost);
	int ret = orig(qp);
	if (ret)
		emit(DATA, "post-failed call=%lu qp=%p ret=%d from=0", call, (void *)base, ret);
	batch.n = batch.lost = 0;
	return ret;
}

static void w_wr_abort(struct ibv_qp_ex *qp)
{
	void (*orig)(struct ibv_qp_ex *) = original(&qps, qp, QPX_ABORT);
	batch.n = batch.lost = 0;
	orig(qp);
}

/* Replace `*field` with `wrapper`, keeping the original in `s->fn[i]` (once per object). */
#define SWAP(s, i, field, wrapper)                                                 \
	do {                                                                       \
		if ((field) && (void *)(field) != (void *)(wrapper)) {             \
			(s)->fn[i] = (void *)(field);                              \
			(field) = (wrapper);                                       \
		}                                                                  \
	} while (0)

static void wrap_qpx(struct ibv_qp *qp)
{
	REAL(struct ibv_qp_ex *, ibv_qp_to_qp_ex, struct ibv_qp *);
	struct ibv_qp_ex *x = real_ibv_qp_to_qp_ex ? real_ibv_qp_to_qp_ex(qp) : NULL;
	if (!x || !x->wr_start)
		return;
	pthread_mutex_lock(&lock);
	struct slot *s = slot_of(&qps, x, 1), *g = slot_of(&qps_sge, x, 1);
	if (s && g) {
		SWAP(s, QPX_START, x->wr_start, w_wr_start);
		SWAP(s, QPX_COMPLETE, x->wr_complete, w_wr_complete);
		SWAP(s, QPX_ABORT, x->wr_abort, w_wr_abort);
		SWAP(s, QPX_SEND, x->wr_send, w_wr_send);
		SWAP(s, QPX_SEND_IMM, x->wr_send_imm, w_wr_send_imm);
		SWAP(s, QPX_WRITE, x->wr_rdma_write, w_wr_rdma_write);
		SWAP(s, QPX_WRITE_IMM, x->wr_rdma_write_imm, w_wr_rdma_write_imm);
		SWAP(s, QPX_READ, x->wr_rdma_read, w_wr_rdma_read);
		SWAP(g, QPX_SET_SGE, x->wr_set_sge, w_wr_set_sge);
		SWAP(g, QPX_SET_SGE_LIST, x->wr_set_sge_list, w_wr_set_sge_list);
	}
	pthread_mutex_unlock(&lock);
	if (!s || !g)
		emit(LIFECYCLE, "unwrapped qp=%p why=table-full", (void *)qp);
}

/* ---- live QPs, for the qp-error fault ---- */

#define LIVE_QPS 4096
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ibv_qp *live[LIVE_QPS];
static pid_t watcher_pid;

static void *qp_error_watcher(void *arg)
{
	const char *path = arg;
	pthread_setname_np(pthread_self(), "wringer-qp-err");
	struct timespec tick = {0, 5 * 1000 * 1000};
	while (access(path, F_OK) != 0)
		nanosleep(&tick, NULL);
	/* Under live_lock, so that no QP is destroyed while it is being moved (ibv_destroy_qp
	 * takes it off the list first). */
	pthread_mutex_lock(&live_lock);
	for (int i = 0; i < LIVE_QPS; i++) {
		if (!live[i])
			continue;
		struct ibv_qp_attr attr;
		memset(&attr, 0, sizeof attr);
		attr.qp_state = IBV_QPS_ERR;
		emit(LIFECYCLE, "fault what=qp-error qp=%p qpn=%u", (void *)live[i], live[i]->qp_num);
		ibv_modify_qp(live[i], &attr, IBV_QP_STATE);
	}
	pthread_mutex_unlock(&live_lock);
	return NULL;
}

static void live_add(struct ibv_qp *qp)
{
	pthread_mutex_lock(&live_lock);
	for (int i = 0; i < LIVE_QPS; i++) {
		if (!live[i]) {
			live[i] = qp;
			break;
		}
	}
	pid_t pid = getpid();
	if (watcher_pid != pid) {
		/* One watcher per process (a forked child starts its own). */
		watcher_pid = pid;
		const char *prefix = getenv("WRINGER_VERBS_TRACE");
		static char path[4096];
		if (prefix && *prefix) {
			snprintf(path, sizeof path, "%s.qp-error", prefix);
			pthread_t t;
			if (pthread_create(&t, NULL, qp_error_watcher, path) == 0)
				pthread_detach(t);
		}
	}
	pthread_mutex_unlock(&live_lock);
}

static void live_remove(struct ibv_qp *qp)
{
	pthread_mutex_lock(&live_lock);
	for (int i = 0; i < LIVE_QPS; i++) {
		if (live[i] == qp)
			live[i] = NULL;
	}
	pthread_mutex_unlock(&live_lock);
}

static void qp_line(struct ibv_qp *qp, struct ibv_pd *pd, int ex)
{
	live_add(qp);
	emit(LIFECYCLE, "qp-create qp=%p qpn=%u pd=%p scq=%p rcq=%p srq=%p type=%d ex=%d", (void *)qp,
	     qp->qp_num, (void *)pd, (void *)qp->send_cq, (void *)qp->recv_cq, (void *)qp->srq,
	     qp->qp_type, ex);
}

static void wrap_context(struct ibv_context *ctx);

static struct ibv_qp *w_create_qp_ex(struct ibv_context *ctx, struct ibv_qp_init_attr_ex *attr)
{
	struct ibv_qp *(*orig)(struct ibv_context *, struct ibv_qp_init_attr_ex *) =
		original(&contexts, ctx, CTX_CREATE_QP_EX);
	struct ibv_qp *qp = orig(ctx, attr);
	if (!qp) {
		emit(LIFECYCLE, "create-failed what=qp errno=%d", errno);
		return qp;
	}
	if (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)
		wrap_qpx(qp);
	qp_line(qp, attr->comp_mask & IBV_QP_INIT_ATTR_PD ? attr->pd : qp->pd, 1);
	return qp;
}

static struct ibv_cq_ex *w_create_cq_ex(struct ibv_context *ctx, struct ibv_cq_init_attr_ex *attr)
{
	struct ibv_cq_ex *(*orig)(struct ibv_context *, struct ibv_cq_init_attr_ex *) =
		original(&contexts, ctx, CTX_CREATE_CQ_EX);
	struct ibv_cq_ex *cq = orig(ctx, attr);
	if (!cq) {
		emit(LIFECYCLE, "create-failed what=cq errno=%d", errno);
		return cq;
	}
	pthread_mutex_lock(&lock);
	struct slot *s = slot_of(&cqs, cq, 1);
	if (s) {
		SWAP(s, CQX_START, cq->start_poll, w_start_poll);
		SWAP(s, CQX_NEXT, cq->next_poll, w_next_poll);
	}
	pthread_mutex_unlock(&lock);
	emit(LIFECYCLE, "cq-create cq=%p ctx=%p cqe=%u ex=1", (void *)cq, (void *)ctx, attr->cqe);
	return cq;
}

/* Wrap a context's ops table (and its extended create functions) the first time it is seen;
 * `owner` says who opened it: librdmacm keeps its device contexts for the process's life. */
static void wrap_context_by(struct ibv_context *ctx, const char *owner)
{
	if (!ctx)
		return;
	pthread_mutex_lock(&lock);
	struct slot *s = slot_of(&contexts, ctx, 0);
	int fresh = !s;
	if (fresh && (s = slot_of(&contexts, ctx, 1))) {
		SWAP(s, CTX_POST_SEND, ctx->ops.post_send, w_post_send);
		SWAP(s, CTX_POST_RECV, ctx->ops.post_recv, w_post_recv);
		SWAP(s, CTX_POLL_CQ, ctx->ops.poll_cq, w_poll_cq);
		SWAP(s, CTX_POST_SRQ_RECV, ctx->ops.post_srq_recv, w_post_srq_recv);
		struct verbs_context *v = verbs_get_ctx(ctx);
		if (v && v->sz >= sizeof(*v) - offsetof(struct verbs_context, create_qp_ex)) {
			SWAP(s, CTX_CREATE_QP_EX, v->create_qp_ex, w_create_qp_ex);
		}
		if (v && v->sz >= sizeof(*v) - offsetof(struct verbs_context, create_cq_ex)) {
			SWAP(s, CTX_CREATE_CQ_EX, v->create_cq_ex, w_create_cq_ex);
		}
	}
	pthread_mutex_unlock(&lock);
	if (fresh)
		emit(LIFECYCLE, "ctx-open ctx=%p dev=%s by=%s", (void *)ctx,
		     ctx->device ? ctx->device->name : "?", owner);
}

static void wrap_context(struct ibv_context *ctx)
{
	wrap_context_by(ctx, "program");
}

/* ---- lifecycles: the exported functions ---- */

EXPORT struct ibv_context *ibv_open_device(struct ibv_device *dev)
{
	REAL(struct ibv_context *, ibv_open_device, struct ibv_device *);
	struct ibv_context *ctx = real_ibv_open_device(dev);
	Dl_info caller;
	int by_cm = dladdr(__builtin_return_address(0), &caller) && caller.dli_fname &&
		    strstr(caller.dli_fname, "librdmacm");
	wrap_context_by(ctx, by_cm ? "librdmacm" : "program");
	return ctx;
}

EXPORT int ibv_close_device(struct ibv_context *ctx)
{
	REAL(int, ibv_close_device, struct ibv_context *);
	emit(LIFECYCLE, "ctx-close ctx=%p", (void *)ctx);
	int ret = real_ibv_close_device(ctx);
	if (ret)
		emit(LIFECYCLE, "destroy-failed what=ctx obj=%p ret=%d", (void *)ctx, ret);
	return ret;
}

EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *ctx)
{
	REAL(struct ibv_pd *, ibv_alloc_pd, struct ibv_context *);
	wrap_context(ctx);
	struct ibv_pd *pd = real_ibv_alloc_pd(ctx);
	if (pd)
		emit(LIFECYCLE, "pd-alloc pd=%p ctx=%p", (void *)pd, (void *)ctx);
	return pd;
}

EXPORT int ibv_dealloc_pd(struct ibv_pd *pd)
{
	REAL(int, ibv_dealloc_pd, struct ibv_pd *);
	emit(LIFECYCLE, "pd-dealloc pd=%p", (void *)pd);
	int ret = real_ibv_dealloc_pd(pd);
	if (ret)
		emit(LIFECYCLE, "destroy-failed what=pd obj=%p ret=%d", (void *)pd, ret);
	return ret;
}

static struct ibv_mr *mr_line(struct ibv_mr *mr, struct ibv_pd *pd, void *addr, size_t len,
			      const char *kind)
{
	if (!mr) {
		emit(LIFECYCLE, "create-failed what=mr errno=%d", errno);
		return mr;
	}
	emit(LIFECYCLE, "mr-reg mr=%p pd=%p addr=0x%lx len=%zu lkey=%u rkey=%u kind=%s", (void *)mr,
	     (void *)pd, (unsigned long)addr, len, mr->lkey, mr->rkey, kind);
	if (addr)
		mr_range(mr, (uintptr_t)addr, len);
	return mr;
}

/* libibverbs may implement one registration through another: only the outermost records. */
#define MR_CALL(expr, pd, addr, len, kind)                                         \
	do {                                                                       \
		depth++;                                                           \
		struct ibv_mr *mr = (expr);                                        \
		depth--;                                                           \
		return depth ? mr : mr_line(mr, pd, addr, len, kind);              \
	} while (0)

EXPORT struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access)
{
	REAL(struct ibv_mr *, ibv_reg_mr, struct ibv_pd *, void *, size_t, int);
	MR_CALL(real_ibv_reg_mr(pd, addr, len, access), pd, addr, len, "host");
}

EXPORT struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova,
				      int access)
{
	REAL(struct ibv_mr *, ibv_reg_mr_iova, struct ibv_pd *, void *, size_t, uint64_t, int);
	MR_CALL(real_ibv_reg_mr_iova(pd, addr, len, iova, access), pd, addr, len, "host");
}

EXPORT struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova,
				       unsigned int access)
{
	REAL(struct ibv_mr *, ibv_reg_mr_iova2, struct ibv_pd *, void *, size_t, uint64_t,
	     unsigned int);
	MR_CALL(real_ibv_reg_mr_iova2(pd, addr, len, iova, access), pd, addr, len, "host");
}

EXPORT struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t len,
					uint64_t iova, int fd, int access)
{
	REAL(struct ibv_mr *, ibv_reg_dmabuf_mr, struct ibv_pd *, uint64_t, size_t, uint64_t, int,
	     int);
	/* Device memory: no host range to watch; its WRs address it by iova. */
	MR_CALL(real_ibv_reg_dmabuf_mr(pd, offset, len, iova, fd, access), pd, NULL, len, "dmabuf");
}

EXPORT int ibv_dereg_mr(struct ibv_mr *mr)
{
	REAL(int, ibv_dereg_mr, struct ibv_mr *);
	emit(LIFECYCLE, "mr-dereg mr=%p", (void *)mr);
	mr_range(mr, 0, 0);
	int ret = real_ibv_dereg_mr(mr);
	if (ret)
		emit(LIFECYCLE, "destroy-failed what=mr obj=%p ret=%d", (void *)mr, ret);
	return ret;
}

EXPORT struct ibv_cq *ibv_create_cq(struct ibv_context *ctx, int cqe, void *user,
				    struct ibv_comp_channel *channel, int vector)
{
	REAL(struct ibv_cq *, ibv_create_cq, struct ibv_context *, int, void *,
	     struct ibv_comp_channel *, int);
	wrap_context(ctx);
	struct ibv_cq *cq = real_ibv_create_cq(ctx, cqe, user, channel, vector);
	if (cq)
		emit(LIFECYCLE, "cq-create cq=%p ctx=%p cqe=%d ex=0", (void *)cq, (void *)ctx, cqe);
	else
		emit(LIFECYCLE, "create-failed what=cq errno=%d", errno);
	return cq;
}

EXPORT int ibv_destroy_cq(struct ibv_cq *cq)
{
	REAL(int, ibv_destroy_cq, struct ibv_cq *);
	emit(LIFECYCLE, "cq-destroy cq=%p", (void *)cq);
	int ret = real_ibv_destroy_cq(cq);
	if (ret)
		emit(LIFECYCLE, "destroy-failed what=cq obj=%p ret=%d", (void *)cq, ret);
	return ret;
}

EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	REAL(struct ibv_qp *, ibv_create_qp, struct ibv_pd *, struct ibv_qp_init_attr *);
	wrap_context(pd ? pd->context : NULL);
	struct ibv_qp *qp = real_ibv_create_qp(pd, attr);
	if (qp)
		qp_line(qp, pd, 0);
	else
		emit(LIFECYCLE, "create-failed what=qp errno=%d", errno);
	return qp;
}

EXPORT int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask)
{
	REAL(int, ibv_modify_qp, struct ibv_qp *, struct ibv_qp_attr *, int);
	int ret = real_ibv_modify_qp(qp, attr, mask);
	if (mask & IBV_QP_STATE)
		emit(LIFECYCLE, "qp-modify qp=%p qpn=%u state=%d timeout=%d retry=%d ret=%d", (void *)qp,
		     qp->qp_num, attr->qp_state, mask & IBV_QP_TIMEOUT ? attr->timeout : -1,
		     mask & IBV_QP_RETRY_CNT ? attr->retry_cnt : -1, ret);
	return ret;
}

EXPORT int ibv_destroy_qp(struct ibv_qp *qp)
{
	REAL(int, ibv_destroy_qp, struct ibv_qp *);
	live_remove(qp);
	emit(LIFECYCLE, "qp-destroy qp=%p qpn=%u", (void *)qp, qp->qp_num);
	int ret = real_ibv_destroy_qp(qp);
	if (ret)
		emit(LIFECYCLE, "destroy-failed what=qp obj=%p ret=%d", (void *)qp, ret);
	return ret;
}

EXPORT struct ibv_srq *ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *attr)
{
	REAL(struct ibv_srq *, ibv_create_srq, struct ibv_pd *, struct ibv_srq_init_attr *);
	wrap_context(pd ? pd->context : NULL);
	struct ibv_srq *srq = real_ibv_create_srq(pd, attr);
	if (srq)
		emit(LIFECYCLE, "srq-create srq=%p pd=%p", (void *)srq, (void *)pd);
	else
		emit(LIFECYCLE, "create-failed what=srq errno=%d", errno);
	return srq;
}

EXPORT int ibv_destroy_srq(struct ibv_srq *srq)
{
	REAL(int, ibv_destroy_srq, struct ibv_srq *);
	emit(LIFECYCLE, "srq-destroy srq=%p", (void *)srq);
	int ret = real_ibv_destroy_srq(srq);
	if (ret)
		emit(LIFECYCLE, "destroy-failed what=srq obj=%p ret=%d", (void *)srq, ret);
	return ret;
}

EXPORT int ibv_get_async_event(struct ibv_context *ctx, struct ibv_async_event *ev)
{
	REAL(int, ibv_get_async_event, struct ibv_context *, struct ibv_async_event *);
	int ret = real_ibv_get_async_event(ctx, ev);
	if (!ret)
		emit(LIFECYCLE, "async ctx=%p type=%d element=%p port=%d", (void *)ctx, ev->event_type,
		     ev->element.qp, ev->element.port_num);
	return ret;
}

EXPORT int rdma_create_id(struct rdma_event_channel *ch, struct rdma_cm_id **id, void *user,
			  enum rdma_port_space ps)
{
	REAL(int, rdma_create_id, struct rdma_event_channel *, struct rdma_cm_id **, void *,
	     enum rdma_port_space);
	int ret = real_rdma_create_id(ch, id, user, ps);
	if (!ret)
		emit(LIFECYCLE, "cm-id-create id=%p", (void *)*id);
	return ret;
}

EXPORT int rdma_destroy_id(struct rdma_cm_id *id)
{
	REAL(int, rdma_destroy_id, struct rdma_cm_id *);
	emit(LIFECYCLE, "cm-id-destroy id=%p", (void *)id);
	return real_rdma_destroy_id(id);
}

EXPORT int rdma_get_cm_event(struct rdma_event_channel *ch, struct rdma_cm_event **event)
{
	REAL(int, rdma_get_cm_event, struct rdma_event_channel *, struct rdma_cm_event **);
	int ret = real_rdma_get_cm_event(ch, event);
	if (!ret) {
		struct rdma_cm_event *e = *event;
		/* A connect request's id is new: librdmacm made it without rdma_create_id. */
		if (e->event == RDMA_CM_EVENT_CONNECT_REQUEST)
			emit(LIFECYCLE, "cm-id-create id=%p listener=%p", (void *)e->id, (void *)e->listen_id);
		emit(LIFECYCLE, "cm-event id=%p event=%d status=%d", (void *)e->id, e->event, e->status);
		if (e->id && e->id->verbs)
			wrap_context_by(e->id->verbs, "librdmacm");
	}
	return ret;
}

EXPORT int munmap(void *addr, size_t len)
{
	REAL(int, munmap, void *, size_t);
	if (trace_fd >= 0 && overlaps_mr((uintptr_t)addr, len))
		emit(LIFECYCLE, "munmap addr=0x%lx len=%zu", (unsigned long)addr, len);
	return real_munmap(addr, len);
}

static int is_verbs_library(const char *file)
{
	const char *base = strrchr(file, '/');
	base = base ? base + 1 : file;
	return !strncmp(base, "libibverbs.so", 13) || !strncmp(base, "librdmacm.so", 12);
}

EXPORT void *dlopen(const char *file, int mode)
{
	REAL(void *, dlopen, const char *, int);
	void *lib = real_dlopen(file, mode);
	const char *scope = getenv("WRINGER_VERBS_SCOPE");
	if (!lib || !file || !is_verbs_library(file) || !scope || !*scope)
		return lib;
	/* The scope library needs this one, libibverbs and librdmacm, in that order: a lookup on
	 * its handle finds these wrappers first. */
	void *wrapped = real_dlopen(scope, RTLD_LAZY | RTLD_LOCAL);
	if (!wrapped)
		emit(LIFECYCLE, "unwrapped library=%s why=scope-not-loaded", file);
	return wrapped ? wrapped : lib;
}

/* Heap memory inside a registered range, freed: the checker judges it like an unmap. Resolving
 * the real free may itself free (dlsym's error buffer): until it is known, glibc's own is used. */
extern void __libc_free(void *);
static __thread int resolving_free;

EXPORT void free(void *p)
{
	static void (*real_free)(void *);
	if (!real_free) {
		if (resolving_free) {
			__libc_free(p);
			return;
		}
		resolving_free = 1;
		void *fn = dlsym(RTLD_NEXT, "free");
		resolving_free = 0;
		real_free = fn ? (void (*)(void *))fn : __libc_free;
	}
	if (p && trace_fd >= 0 && overlaps_mr((uintptr_t)p, 1))
		emit(LIFECYCLE, "free addr=0x%lx len=%zu", (unsigned long)p, malloc_usable_size(p));
	real_free(p);
}

/* A program (wringer's rank) marks its steps, so leaks are judged per step. */
EXPORT void wringer_verbs_mark(const char *what)
{
	emit(LIFECYCLE, "mark %s", what);
}

__attribute__((destructor)) static void at_exit(void)
{
	if (trace_fd >= 0 && trace_pid == getpid())
		emit(LIFECYCLE, "exit");
}
