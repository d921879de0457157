// lab_relay: latency and jitter for a lab link (scripts/lab delay), since this kernel has no
// netem. Runs in the lab's router network namespace and takes the packets that an iptables
// NFQUEUE rule hands it (queue --queue, e.g. everything forwarded to or from one host), holds
// each for --delay_ms plus a uniform random ±--jitter_ms, and lets it go on. Holding is only a
// verdict given later: the packet stays in the kernel's queue meanwhile, so nothing is copied.
// Runs until SIGTERM/SIGINT, at real-time priority (a packet's release must not wait for a busy
// CPU); a queue longer than the kernel allows lets packets through (fail open) rather than
// dropping them.
//
//   ip netns exec trlab-router lab_relay --queue 2 --delay_ms 5 --jitter_ms 1 &
#include <arpa/inet.h>
#include <libnetfilter_queue/libnetfilter_queue.h>
#include <linux/netfilter.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <queue>
#include <random>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct Held {
  Clock::time_point due;
  uint32_t id;
  bool operator>(const Held& o) const { return due > o.due; }
};

struct Relay {
  std::chrono::microseconds delay{0}, jitter{0};
  std::mt19937_64 rng{12345};
  std::priority_queue<Held, std::vector<Held>, std::greater<Held>> held;
};

volatile sig_atomic_t stop = 0;

int OnPacket(nfq_q_handle*, nfgenmsg*, nfq_data* data, void* arg) {
  auto* r = static_cast<Relay*>(arg);
  nfqnl_msg_packet_hdr* hdr = nfq_get_msg_packet_hdr(data);
  if (hdr == nullptr) return 0;
  auto d = r->delay;
  if (r->jitter.count() > 0) {
    std::uniform_int_distribution<int64_t> u(-r->jitter.count(), r->jitter.count());
    d += std::chrono::microseconds(u(r->rng));
    if (d.count() < 0) d = std::chrono::microseconds(0);
  }
  r->held.push(Held{Clock::now() + d, ntohl(hdr->packet_id)});
  return 0;
}

int Usage(const char* why) {
  std::fprintf(stderr, "lab_relay: %s\nusage: lab_relay --queue N --delay_ms MS [--jitter_ms MS]\n",
               why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  int queue = -1;
  double delay_ms = -1, jitter_ms = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    char* end = nullptr;
    const double v = std::strtod(argv[i + 1], &end);
    if (end == argv[i + 1] || *end != '\0' || v < 0)
      return Usage("a flag's value is not a number >= 0");
    if (flag == "--queue") {
      queue = static_cast<int>(v);
    } else if (flag == "--delay_ms") {
      delay_ms = v;
    } else if (flag == "--jitter_ms") {
      jitter_ms = v;
    } else {
      return Usage(("unknown flag " + flag).c_str());
    }
  }
  if (queue < 0 || queue > 65535 || delay_ms < 0 || jitter_ms > delay_ms || argc % 2 != 1) {
    return Usage("want --queue in [0, 65535], --delay_ms >= 0 and --jitter_ms <= --delay_ms");
  }
  Relay relay;
  relay.delay = std::chrono::microseconds(static_cast<int64_t>(delay_ms * 1000));
  relay.jitter = std::chrono::microseconds(static_cast<int64_t>(jitter_ms * 1000));
  signal(SIGTERM, [](int) { stop = 1; });
  signal(SIGINT, [](int) { stop = 1; });

  nfq_handle* h = nfq_open();
  if (h == nullptr) return Usage("nfq_open failed (root, and the nfnetlink_queue module?)");
  nfq_q_handle* qh = nfq_create_queue(h, static_cast<uint16_t>(queue), &OnPacket, &relay);
  if (qh == nullptr) return Usage("cannot bind the queue (another relay on it?)");
  if (nfq_set_mode(qh, NFQNL_COPY_META, 0) < 0) return Usage("nfq_set_mode failed");
  nfq_set_queue_maxlen(qh, 65536);
  nfq_set_queue_flags(qh, NFQA_CFG_F_FAIL_OPEN, NFQA_CFG_F_FAIL_OPEN);
  // A packet's release must not wait for a busy CPU: real-time priority (the lab runs as root).
  sched_param sp{};
  sp.sched_priority = 10;
  if (sched_setscheduler(0, SCHED_FIFO, &sp) != 0) {
    std::fprintf(stderr, "lab_relay: warning: no real-time priority (%s): delays may stretch\n",
                 std::strerror(errno));
  }
  const int fd = nfq_fd(h);
  int rcvbuf = 8 << 20;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof(rcvbuf));
  std::fprintf(stderr, "lab_relay: queue %d, delay %.3f ms, jitter ±%.3f ms\n", queue, delay_ms,
               jitter_ms);
  std::vector<char> buf(1 << 16);
  while (!stop) {
    // Wake for the next packet due (microseconds: a millisecond timer would round the delay).
    int64_t wait_us = 100000;
    if (!relay.held.empty()) {
      wait_us = std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::microseconds>(
                                         relay.held.top().due - Clock::now())
                                         .count());
    }
    const timespec ts{static_cast<time_t>(wait_us / 1000000),
                      static_cast<long>(wait_us % 1000000) * 1000};
    pollfd p{fd, POLLIN, 0};
    if (ppoll(&p, 1, &ts, nullptr) > 0) {
      for (;;) {
        const ssize_t n = recv(fd, buf.data(), buf.size(), MSG_DONTWAIT);
        if (n < 0) break;  // EAGAIN, or ENOBUFS (the kernel dropped notices: fail-open covers it)
        nfq_handle_packet(h, buf.data(), static_cast<int>(n));
      }
    }
    const auto now = Clock::now();
    while (!relay.held.empty() && relay.held.top().due <= now) {
      nfq_set_verdict(qh, relay.held.top().id, NF_ACCEPT, 0, nullptr);
      relay.held.pop();
    }
  }
  // Let everything still held go on before the queue goes away.
  while (!relay.held.empty()) {
    nfq_set_verdict(qh, relay.held.top().id, NF_ACCEPT, 0, nullptr);
    relay.held.pop();
  }
  nfq_destroy_queue(qh);
  nfq_close(h);
  return 0;
}
