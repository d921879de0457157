// `troupe relay`: latency and jitter on a host's links, since this kernel (and many a cloud VM's)
// has no netem. Takes the packets an iptables NFQUEUE rule hands it (--queue), holds each for
// --delay plus a uniform random ±--jitter, and lets it go on. Holding is only a verdict given
// later: the packet stays in the kernel's queue meanwhile, so nothing is copied. Runs at real-time
// priority (a packet's release must not wait for a busy CPU) until SIGTERM/SIGINT or --run_for;
// a queue longer than the kernel allows lets packets through (fail open) rather than dropping
// them. The kernel hands over GSO packets whole (NFQA_CFG_F_GSO: up to 64 KiB a verdict instead of
// one per MTU), and without jitter packets leave in arrival order, so one batch verdict releases
// every packet due: a bulk transfer through the relay costs a few verdicts a millisecond, not one
// netlink round trip per 1.5 KB. Used by the node agent's delay fault
// (internal::StartNetworkFault) and by scripts/lab.
#include <arpa/inet.h>
#include <libnetfilter_queue/libnetfilter_queue.h>
#include <linux/netfilter.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <queue>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "internal/roles.h"
#include "troupe/runtime/config.h"
#include "troupe/runtime/log.h"

namespace troupe::runtime::internal {
namespace {

using Clock = std::chrono::steady_clock;

struct Held {
  Clock::time_point due;
  uint32_t id;
  bool operator>(const Held& o) const { return due > o.due || (due == o.due && id > o.id); }
};

struct Relay {
  Duration delay{0}, jitter{0};
  std::mt19937_64 rng{12345};
  std::priority_queue<Held, std::vector<Held>, std::greater<Held>> held;
};

volatile sig_atomic_t g_stop = 0;

int OnPacket(nfq_q_handle*, nfgenmsg*, nfq_data* data, void* arg) {
  auto* r = static_cast<Relay*>(arg);
  nfqnl_msg_packet_hdr* hdr = nfq_get_msg_packet_hdr(data);
  if (hdr == nullptr) return 0;
  Duration d = r->delay;
  if (r->jitter.count() > 0) {
    std::uniform_int_distribution<int64_t> u(-r->jitter.count(), r->jitter.count());
    d = std::max(Duration(0), d + Duration(u(r->rng)));
  }
  r->held.push(Held{Clock::now() + d, ntohl(hdr->packet_id)});
  return 0;
}

// Gives every held packet whose time has come (all of them when `all`) its verdict. Without
// jitter they are due in arrival (id) order, so one batch verdict covers them all: it accepts
// every packet of the queue up to that id.
void Release(nfq_q_handle* qh, Relay& relay, bool all) {
  const auto now = Clock::now();
  const bool in_order = relay.jitter.count() == 0;
  bool batch = false;
  uint32_t last = 0;
  while (!relay.held.empty() && (all || relay.held.top().due <= now)) {
    if (in_order) {
      last = batch ? std::max(last, relay.held.top().id) : relay.held.top().id;
      batch = true;
    } else {
      nfq_set_verdict(qh, relay.held.top().id, NF_ACCEPT, 0, nullptr);
    }
    relay.held.pop();
  }
  if (batch) nfq_set_verdict_batch(qh, last, NF_ACCEPT);
}

// Serves queue `qh` until stopped or `until`.
void Serve(nfq_handle* h, nfq_q_handle* qh, Relay& relay, Clock::time_point until) {
  const int fd = nfq_fd(h);
  std::vector<char> buf(1 << 16);
  while (!g_stop && Clock::now() < until) {
    // Wake for the next packet due (nanoseconds: a millisecond timer would round the delay).
    Clock::time_point wake = std::min(until, Clock::now() + std::chrono::milliseconds(100));
    if (!relay.held.empty()) wake = std::min(wake, relay.held.top().due);
    const int64_t wait_ns = std::max<int64_t>(0, (wake - Clock::now()).count());
    const timespec ts{static_cast<time_t>(wait_ns / 1000000000),
                      static_cast<long>(wait_ns % 1000000000)};
    pollfd p{fd, POLLIN, 0};
    if (ppoll(&p, 1, &ts, nullptr) > 0) {
      for (;;) {
        const ssize_t n = recv(fd, buf.data(), buf.size(), MSG_DONTWAIT);
        if (n < 0) break;  // EAGAIN, or ENOBUFS (the kernel dropped notices: fail-open covers it)
        nfq_handle_packet(h, buf.data(), static_cast<int>(n));
      }
    }
    Release(qh, relay, /*all=*/false);
  }
  Release(qh, relay, /*all=*/true);  // everything still held goes on before the queue goes away
}

}  // namespace

int RelayMain(const std::vector<std::string>& args) {
  int64_t queue = -1, ready_fd = -1;
  Duration delay{0}, jitter{0}, run_for{0};
  ConfigRegistry config;
  config.AddInt("queue", &queue, "the NFQUEUE number to serve", InRange(0, 65535));
  config.AddDuration("delay", &delay, "how long each packet is held", Positive());
  config.AddDuration("jitter", &jitter, "a uniform random ± added to each packet's delay");
  config.AddDuration("run_for", &run_for, "stop after this long (0: at SIGTERM or SIGINT)");
  config.AddInt("ready_fd", &ready_fd, "a descriptor to write one byte to once the queue is bound",
                InRange(-1, 1 << 20));
  if (int rc = ParseCommandLine("relay",
                                "usage: troupe relay --queue N --delay 5ms [--jitter 1ms] "
                                "[--run_for 3s]\nHolds the packets of an iptables NFQUEUE rule "
                                "(root): latency and jitter without netem.",
                                args, config);
      rc >= 0)
    return rc;
  if (queue < 0 || delay <= Duration(0) || jitter < Duration(0) || jitter > delay ||
      run_for < Duration(0)) {
    LogError("relay", absl::StrCat("want --queue in [0, 65535], --delay > 0, 0 <= --jitter <= "
                                   "--delay and --run_for >= 0; got --queue ",
                                   queue, " --delay ", FormatDuration(delay), " --jitter ",
                                   FormatDuration(jitter), " --run_for ", FormatDuration(run_for)));
    return 2;
  }
  Relay relay;
  relay.delay = delay;
  relay.jitter = jitter;
  signal(SIGTERM, [](int) { g_stop = 1; });
  signal(SIGINT, [](int) { g_stop = 1; });
  nfq_handle* h = nfq_open();
  if (h == nullptr) {
    LogError("relay", "nfq_open failed (root, and the nfnetlink_queue module?)");
    return 1;
  }
  nfq_q_handle* qh = nfq_create_queue(h, static_cast<uint16_t>(queue), &OnPacket, &relay);
  if (qh == nullptr || nfq_set_mode(qh, NFQNL_COPY_META, 0) < 0) {
    LogError("relay", absl::StrCat("cannot bind queue ", queue, " (another relay on it?)"));
    nfq_close(h);
    return 1;
  }
  nfq_set_queue_maxlen(qh, 65536);
  nfq_set_queue_flags(qh, NFQA_CFG_F_FAIL_OPEN | NFQA_CFG_F_GSO,
                      NFQA_CFG_F_FAIL_OPEN | NFQA_CFG_F_GSO);
  sched_param sp{};
  sp.sched_priority = 10;
  if (sched_setscheduler(0, SCHED_FIFO, &sp) != 0) {
    LogWarn("relay",
            absl::StrCat("no real-time priority (", std::strerror(errno), "): delays may stretch"));
  }
  int rcvbuf = 8 << 20;
  setsockopt(nfq_fd(h), SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof(rcvbuf));
  std::fprintf(stderr, "troupe relay: queue %d, delay %s, jitter ±%s\n", static_cast<int>(queue),
               FormatDuration(delay).c_str(), FormatDuration(jitter).c_str());
  if (ready_fd >= 0) {
    const char byte = 1;
    [[maybe_unused]] ssize_t n = write(static_cast<int>(ready_fd), &byte, 1);
    close(static_cast<int>(ready_fd));
  }
  Serve(h, qh, relay, run_for > Duration(0) ? Clock::now() + run_for : Clock::time_point::max());
  nfq_destroy_queue(qh);
  nfq_close(h);
  return 0;
}

}  // namespace troupe::runtime::internal
