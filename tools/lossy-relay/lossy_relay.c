/*
 * lossy-relay: a UDP relay that delays, jitters, drops and reorders, for tests and benchmarks
 * on kernels without netem.
 *
 *   lossy-relay --listen IP:PORT --upstream IP:PORT [--delay MS] [--jitter MS] [--loss P]
 *               [--reorder P] [--reorder-delay MS] [--limit PACKETS] [--seed N]
 *
 * Datagrams from anyone but the upstream go to the upstream; datagrams from the upstream go
 * back to the last other sender (one client at a time, as a WireGuard peer). Each direction,
 * each datagram independently:
 *   - is dropped with probability --loss (0..1);
 *   - is held --delay ms (one way: a round trip through the relay adds twice that), plus a
 *     uniform 0..--jitter ms that never reorders (a datagram leaves no earlier than the one
 *     before it, as on a real path whose queue varies);
 *   - with probability --reorder is held --reorder-delay ms more (default 1..4 ms at random
 *     when not given), so later datagrams overtake it;
 *   - is dropped when --limit datagrams (default 100000) are already held (a tail-drop queue)
 *     or the socket cannot take it (counted as "overflow", apart from the chosen "dropped").
 * Prints "ready" once bound; on SIGTERM or SIGINT prints one JSON line of counters and exits 0.
 * Bad arguments: one line on stderr naming the argument, exit 2.
 *
 * One thread, one socket, recvmmsg/sendmmsg in batches, held datagrams in a binary heap ordered
 * by release time: about a million datagrams a second on one core, far beyond what the tunnels
 * under test carry.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BATCH 64
#define MAXDGRAM 65536

typedef struct {
    uint64_t at;     /* release time, ns (monotonic) */
    uint64_t order;  /* arrival order: ties leave in arrival order */
    int to_up;       /* 1: to the upstream, 0: to the client */
    uint16_t len;
    unsigned char *data;
} held_t;

static held_t *heap;
static size_t heap_n, heap_cap;
static volatile sig_atomic_t stopping;
static uint64_t rng_state = 0x9E3779B97F4A7C15ULL;

static uint64_t rng(void) { /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ULL;
}

static double uniform(void) { return (rng() >> 11) * (1.0 / 9007199254740992.0); }

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static int before(const held_t *a, const held_t *b) {
    return a->at < b->at || (a->at == b->at && a->order < b->order);
}

static void heap_push(held_t h) {
    size_t i = heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!before(&h, &heap[p])) break;
        heap[i] = heap[p];
        i = p;
    }
    heap[i] = h;
}

static held_t heap_pop(void) {
    held_t top = heap[0], last = heap[--heap_n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= heap_n) break;
        if (c + 1 < heap_n && before(&heap[c + 1], &heap[c])) c++;
        if (!before(&heap[c], &last)) break;
        heap[i] = heap[c];
        i = c;
    }
    if (heap_n) heap[i] = last;
    return top;
}

static void on_signal(int sig) { (void)sig; stopping = 1; }

static void usage_error(const char *what) {
    fprintf(stderr, "lossy-relay: %s (usage: lossy-relay --listen IP:PORT --upstream IP:PORT [--delay MS] "
                    "[--jitter MS] [--loss P] [--reorder P] [--reorder-delay MS] [--limit N] [--seed N])\n", what);
    exit(2);
}

static void parse_addr(const char *flag, const char *text, struct sockaddr_in *out) {
    char host[64];
    const char *colon = strrchr(text, ':');
    char *end;
    if (!colon || (size_t)(colon - text) >= sizeof host) goto bad;
    memcpy(host, text, colon - text);
    host[colon - text] = 0;
    long port = strtol(colon + 1, &end, 10);
    if (*end || port < 1 || port > 65535) goto bad;
    memset(out, 0, sizeof *out);
    out->sin_family = AF_INET;
    out->sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &out->sin_addr) != 1) goto bad;
    return;
bad:;
    char msg[160];
    snprintf(msg, sizeof msg, "%s: expected IPv4:PORT, got '%s'", flag, text);
    usage_error(msg);
}

static double parse_num(const char *flag, const char *text, double lo, double hi) {
    char *end;
    double v = strtod(text, &end);
    if (*end || end == text || v < lo || v > hi) {
        char msg[160];
        snprintf(msg, sizeof msg, "%s: expected a number from %g to %g, got '%s'", flag, lo, hi, text);
        usage_error(msg);
    }
    return v;
}

int main(int argc, char **argv) {
    struct sockaddr_in listen_addr, up, client;
    int have_listen = 0, have_up = 0, have_client = 0;
    double delay_ms = 0, jitter_ms = 0, loss = 0, reorder = 0, reorder_ms = -1;
    long limit = 100000;
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i];
        if (i + 1 >= argc) usage_error("every option takes a value");
        const char *v = argv[++i];
        if (!strcmp(flag, "--listen")) parse_addr(flag, v, &listen_addr), have_listen = 1;
        else if (!strcmp(flag, "--upstream")) parse_addr(flag, v, &up), have_up = 1;
        else if (!strcmp(flag, "--delay")) delay_ms = parse_num(flag, v, 0, 10000);
        else if (!strcmp(flag, "--jitter")) jitter_ms = parse_num(flag, v, 0, 10000);
        else if (!strcmp(flag, "--loss")) loss = parse_num(flag, v, 0, 1);
        else if (!strcmp(flag, "--reorder")) reorder = parse_num(flag, v, 0, 1);
        else if (!strcmp(flag, "--reorder-delay")) reorder_ms = parse_num(flag, v, 0, 10000);
        else if (!strcmp(flag, "--limit")) limit = (long)parse_num(flag, v, 1, 10000000);
        else if (!strcmp(flag, "--seed")) rng_state = (uint64_t)parse_num(flag, v, 1, 1e18);
        else {
            char msg[160];
            snprintf(msg, sizeof msg, "unknown option '%s'", flag);
            usage_error(msg);
        }
    }
    if (!have_listen || !have_up) usage_error("--listen and --upstream are required");

    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
    if (fd < 0) { perror("lossy-relay: socket"); return 1; }
    int sz = 16 << 20;
    if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &sz, sizeof sz) < 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
    if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &sz, sizeof sz) < 0)
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
    if (bind(fd, (struct sockaddr *)&listen_addr, sizeof listen_addr) < 0) {
        fprintf(stderr, "lossy-relay: --listen: cannot bind: %s\n", strerror(errno));
        return 1;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    /* The signals stay blocked except inside ppoll, which unblocks them atomically: one that
     * arrives between the `stopping` check and the wait is delivered there and ends the wait,
     * instead of landing before a wait with no timeout (nothing held) that would never end. */
    sigset_t stop_signals, waiting_mask;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGINT);
    sigprocmask(SIG_BLOCK, &stop_signals, &waiting_mask);
    sigdelset(&waiting_mask, SIGTERM);
    sigdelset(&waiting_mask, SIGINT);

    heap_cap = (size_t)limit;
    heap = calloc(heap_cap, sizeof *heap);
    static unsigned char bufs[BATCH][MAXDGRAM];
    static struct mmsghdr msgs[BATCH], outs[BATCH];
    static struct iovec iovs[BATCH], oiovs[BATCH];
    static struct sockaddr_in froms[BATCH];
    held_t sending[BATCH];
    if (!heap) { fputs("lossy-relay: out of memory\n", stderr); return 1; }
    uint64_t forwarded = 0, dropped = 0, reordered = 0, overflow = 0, order = 0;
    uint64_t last_at[2] = {0, 0};
    const uint64_t delay = (uint64_t)(delay_ms * 1e6);
    printf("ready\n");
    fflush(stdout);

    while (!stopping) {
        struct timespec wait_for, *timeout = NULL;  /* NULL: until a datagram or a signal */
        if (heap_n) {
            uint64_t t = now_ns();
            uint64_t left = heap[0].at <= t ? 0 : heap[0].at - t;
            wait_for.tv_sec = (time_t)(left / 1000000000u);
            wait_for.tv_nsec = (long)(left % 1000000000u);
            timeout = &wait_for;
        }
        struct pollfd pfd = {fd, POLLIN, 0};
        int pr = ppoll(&pfd, 1, timeout, &waiting_mask);
        if (pr < 0 && errno != EINTR) { perror("lossy-relay: ppoll"); return 1; }
        if (pr > 0 && (pfd.revents & POLLIN)) {
            for (int i = 0; i < BATCH; i++) {
                iovs[i].iov_base = bufs[i];
                iovs[i].iov_len = MAXDGRAM;
                memset(&msgs[i].msg_hdr, 0, sizeof msgs[i].msg_hdr);
                msgs[i].msg_hdr.msg_iov = &iovs[i];
                msgs[i].msg_hdr.msg_iovlen = 1;
                msgs[i].msg_hdr.msg_name = &froms[i];
                msgs[i].msg_hdr.msg_namelen = sizeof froms[i];
            }
            int n = recvmmsg(fd, msgs, BATCH, MSG_DONTWAIT, NULL);
            uint64_t t = now_ns();
            for (int i = 0; i < n; i++) {
                const struct sockaddr_in *from = &froms[i];
                int from_up = from->sin_addr.s_addr == up.sin_addr.s_addr && from->sin_port == up.sin_port;
                if (!from_up) { client = *from; have_client = 1; }
                else if (!have_client) continue;
                if (loss > 0 && uniform() < loss) { dropped++; continue; }
                if (heap_n >= heap_cap) { overflow++; continue; }
                int dir = !from_up;
                uint64_t at = t + delay + (jitter_ms > 0 ? (uint64_t)(uniform() * jitter_ms * 1e6) : 0);
                if (at < last_at[dir]) at = last_at[dir];  /* jitter never reorders */
                last_at[dir] = at;
                if (reorder > 0 && uniform() < reorder) {
                    double extra = reorder_ms >= 0 ? reorder_ms : 1.0 + 3.0 * uniform();
                    at += (uint64_t)(extra * 1e6);
                    reordered++;
                }
                unsigned len = msgs[i].msg_len;
                unsigned char *copy = malloc(len ? len : 1);
                if (!copy) { overflow++; continue; }
                memcpy(copy, bufs[i], len);
                heap_push((held_t){at, order++, dir, (uint16_t)len, copy});
            }
        }
        uint64_t t = now_ns();
        while (heap_n && heap[0].at <= t) {
            int k = 0;
            while (k < BATCH && heap_n && heap[0].at <= t) {
                sending[k] = heap_pop();
                oiovs[k].iov_base = sending[k].data;
                oiovs[k].iov_len = sending[k].len;
                memset(&outs[k].msg_hdr, 0, sizeof outs[k].msg_hdr);
                outs[k].msg_hdr.msg_iov = &oiovs[k];
                outs[k].msg_hdr.msg_iovlen = 1;
                outs[k].msg_hdr.msg_name = sending[k].to_up ? &up : &client;
                outs[k].msg_hdr.msg_namelen = sizeof up;
                k++;
            }
            int done = 0;
            while (done < k) {
                int s = sendmmsg(fd, outs + done, k - done, 0);
                if (s <= 0) { overflow += k - done; break; }  /* a full socket buffer: the path lost them */
                done += s;
            }
            forwarded += done;
            for (int i = 0; i < k; i++) free(sending[i].data);
        }
    }
    printf("{\"forwarded\": %llu, \"dropped\": %llu, \"reordered\": %llu, \"overflow\": %llu}\n",
           (unsigned long long)forwarded, (unsigned long long)dropped, (unsigned long long)reordered,
           (unsigned long long)overflow);
    fflush(stdout);
    return 0;
}
