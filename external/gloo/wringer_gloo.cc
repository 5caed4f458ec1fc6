// wringer-gloo: a small driver for the real Gloo (Debian's libgloo-dev), so wringer's exec
// scenarios can put Gloo's TCP transport under faults. Every rank connects a full mesh through a
// FileStore, then runs ring allreduces, checks every element, and prints what it measured as
// `key=value` lines on stdout. Any Gloo error is printed as `error: ...` and exits 1.
//
//   wringer-gloo --rank R --size N --store DIR|tcp:HOST:PORT --host IP [--prefix P]
//                [--timeout-ms T] [--rounds K] [--sizes 64,4096,...] [--until-error]
//
// --store DIR is Gloo's FileStore (ranks on one host); --store tcp:HOST:PORT is a small
// key-value store that rank 0 serves on HOST:PORT, for ranks on different hosts.
//
// --until-error keeps running allreduces (one every 10 ms) after the measured rounds, for the
// scenarios that kill or freeze a peer and time how the survivors notice.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gloo/allreduce_ring.h>
#include <gloo/barrier.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <arpa/inet.h>
#include <map>
#include <mutex>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace {

struct Options {
  int rank = -1;
  int size = -1;
  std::string store;
  std::string host = "127.0.0.1";
  std::string prefix = "wringer";
  long timeout_ms = 2000;
  int rounds = 50;
  std::vector<long> sizes = {64, 4096, 65536, 1048576};
  bool until_error = false;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "usage error: %s\n", why.c_str());
  std::exit(2);
}

long number(const char* flag, const char* text) {
  char* end = nullptr;
  long v = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || v < 0) usage(std::string(flag) + " needs a number >= 0");
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    if (a == "--until-error") {
      o.until_error = true;
      continue;
    }
    if (i + 1 >= argc) usage(a + " needs a value");
    const char* v = argv[++i];
    if (a == "--rank") o.rank = number("--rank", v);
    else if (a == "--size") o.size = number("--size", v);
    else if (a == "--store") o.store = v;
    else if (a == "--host") o.host = v;
    else if (a == "--prefix") o.prefix = v;
    else if (a == "--timeout-ms") o.timeout_ms = number("--timeout-ms", v);
    else if (a == "--rounds") o.rounds = number("--rounds", v);
    else if (a == "--sizes") {
      o.sizes.clear();
      std::stringstream ss(v);
      std::string item;
      while (std::getline(ss, item, ',')) o.sizes.push_back(number("--sizes", item.c_str()));
    } else usage("unknown flag " + a);
  }
  if (o.size < 1 || o.rank < 0 || o.rank >= o.size) usage("--rank must be below --size");
  if (o.store.empty()) usage("--store is required");
  if (o.timeout_ms < 1) usage("--timeout-ms must be above 0");
  for (long s : o.sizes)
    if (s < 4 || s % 4 != 0) usage("sizes are bytes, a multiple of 4");
  return o;
}

// A key-value store over TCP for Gloo's rendezvous across hosts. Text lines, keys and values
// hex-encoded: "SET k v" -> "OK", "GET k" -> "VAL v" or "NONE". Every wait is bounded.
std::string hex(const std::string& s) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out.push_back(d[c >> 4]);
    out.push_back(d[c & 15]);
  }
  return out;
}

std::string unhex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out.push_back(char(std::stoi(h.substr(i, 2), nullptr, 16)));
  return out;
}

bool read_line(int fd, std::string& line) {
  line.clear();
  char c;
  while (true) {
    ssize_t n = ::recv(fd, &c, 1, 0);
    if (n <= 0) return false;
    if (c == '\n') return true;
    line.push_back(c);
  }
}

bool write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += size_t(n);
  }
  return true;
}

sockaddr_storage resolve(const std::string& host, int port, socklen_t& len) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res)
    throw std::runtime_error("store: cannot resolve " + host);
  sockaddr_storage ss{};
  std::memcpy(&ss, res->ai_addr, res->ai_addrlen);
  len = res->ai_addrlen;
  freeaddrinfo(res);
  return ss;
}

// Rank 0's side: serves the map until the process exits.
void serve_store(const std::string& host, int port) {
  socklen_t len = 0;
  sockaddr_storage ss = resolve(host, port, len);
  int l = ::socket(ss.ss_family, SOCK_STREAM, 0);
  int one = 1;
  ::setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (l < 0 || ::bind(l, reinterpret_cast<sockaddr*>(&ss), len) != 0 || ::listen(l, 64) != 0)
    throw std::runtime_error("store: cannot listen on " + host + ":" + std::to_string(port));
  auto data = std::make_shared<std::map<std::string, std::string>>();
  auto mu = std::make_shared<std::mutex>();
  std::thread([l, data, mu] {
    while (true) {
      int c = ::accept(l, nullptr, nullptr);
      if (c < 0) continue;
      std::thread([c, data, mu] {
        std::string line;
        while (read_line(c, line)) {
          std::string reply = "NONE\n";
          if (line.rfind("SET ", 0) == 0) {
            auto sp = line.find(' ', 4);
            std::lock_guard<std::mutex> g(*mu);
            (*data)[line.substr(4, sp - 4)] = sp == std::string::npos ? "" : line.substr(sp + 1);
            reply = "OK\n";
          } else if (line.rfind("GET ", 0) == 0) {
            std::lock_guard<std::mutex> g(*mu);
            auto it = data->find(line.substr(4));
            if (it != data->end()) reply = "VAL " + it->second + "\n";
          }
          if (!write_all(c, reply)) break;
        }
        ::close(c);
      }).detach();
    }
  }).detach();
}

class TcpStore : public gloo::rendezvous::Store {
 public:
  TcpStore(const std::string& host, int port, std::chrono::milliseconds limit) : limit_(limit) {
    socklen_t len = 0;
    sockaddr_storage ss = resolve(host, port, len);
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (true) {
      fd_ = ::socket(ss.ss_family, SOCK_STREAM, 0);
      if (::connect(fd_, reinterpret_cast<sockaddr*>(&ss), len) == 0) break;
      ::close(fd_);
      if (std::chrono::steady_clock::now() > deadline)
        throw std::runtime_error("store: cannot reach " + host + ":" + std::to_string(port));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    timeval tv{long(limit.count() / 1000), long(limit.count() % 1000) * 1000};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  ~TcpStore() override { ::close(fd_); }

  void set(const std::string& key, const std::vector<char>& v) override {
    ask("SET " + hex(key) + " " + hex(std::string(v.begin(), v.end())));
  }

  std::vector<char> get(const std::string& key) override {
    wait({key});
    std::string r = ask("GET " + hex(key));
    std::string v = unhex(r.substr(4));
    return std::vector<char>(v.begin(), v.end());
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, limit_); }

  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& limit) override {
    auto deadline = std::chrono::steady_clock::now() + limit;
    for (const auto& k : keys) {
      while (ask("GET " + hex(k)).rfind("VAL ", 0) != 0) {
        if (std::chrono::steady_clock::now() > deadline)
          throw std::runtime_error("store: key " + k + " did not appear in time");
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
  }

 private:
  std::string ask(const std::string& line) {
    std::lock_guard<std::mutex> g(mu_);
    std::string reply;
    if (!write_all(fd_, line + "\n") || !read_line(fd_, reply))
      throw std::runtime_error("store: the connection to rank 0's store failed");
    return reply;
  }

  int fd_ = -1;
  std::chrono::milliseconds limit_;
  std::mutex mu_;
};

double since_us(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t).count();
}

// Every rank fills element i of round r with rank + i + r; the sum over ranks is known.
long allreduce_checked(const std::shared_ptr<gloo::Context>& ctx, int size, long count, int round) {
  std::vector<float> data(count);
  for (long i = 0; i < count; i++) data[i] = float(ctx->rank + (i % 1024) + round % 7);
  std::vector<float*> ptrs{data.data()};
  gloo::AllreduceRing<float> algo(ctx, ptrs, int(count));
  algo.run();
  long bad = 0;
  for (long i = 0; i < count; i++) {
    float want = float(size) * float((i % 1024) + round % 7) + float(size) * float(size - 1) / 2;
    if (data[i] != want) bad++;
  }
  return bad;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  try {
    auto start = std::chrono::steady_clock::now();
    gloo::transport::tcp::attr attr;
    attr.hostname = o.host;
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    std::unique_ptr<gloo::rendezvous::Store> base;
    if (o.store.rfind("tcp:", 0) == 0) {
      auto colon = o.store.rfind(':');
      std::string host = o.store.substr(4, colon - 4);
      int port = std::atoi(o.store.c_str() + colon + 1);
      if (port <= 0) usage("--store tcp:HOST:PORT needs a port");
      if (o.rank == 0) serve_store(host, port);
      base.reset(new TcpStore(host, port, std::chrono::milliseconds(30000)));
    } else {
      base.reset(new gloo::rendezvous::FileStore(o.store));
    }
    gloo::rendezvous::PrefixStore store(o.prefix, *base);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(o.rank, o.size);
    ctx->setTimeout(std::chrono::milliseconds(o.timeout_ms));
    ctx->connectFullMesh(store, dev);
    std::printf("connected rank=%d size=%d connect_ms=%.1f\n", o.rank, o.size, since_us(start) / 1000);
    long mismatches = 0;
    long total_rounds = 0;
    for (long bytes : o.sizes) {
      std::vector<double> lat;
      for (int r = 0; r < o.rounds; r++) {
        auto t = std::chrono::steady_clock::now();
        mismatches += allreduce_checked(ctx, o.size, bytes / 4, r);
        lat.push_back(since_us(t));
        total_rounds++;
      }
      if (lat.empty()) continue;
      std::sort(lat.begin(), lat.end());
      double p50 = lat[lat.size() / 2];
      double p99 = lat[std::min(lat.size() - 1, lat.size() * 99 / 100)];
      std::printf("allreduce bytes=%ld rounds=%d p50_us=%.1f p99_us=%.1f\n", bytes, o.rounds, p50, p99);
    }
    std::printf("checked rounds=%ld mismatches=%ld\n", total_rounds, mismatches);
    if (o.until_error) {
      std::printf("looping until an error\n");
      for (int r = 0;; r++) {
        mismatches += allreduce_checked(ctx, o.size, 1024, r);
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    // A closing barrier: no rank tears its pairs down while a slower peer is still inside its
    // last allreduce (closing with unread data would reset that peer's connection).
    gloo::BarrierOptions closing(ctx);
    closing.setTimeout(std::chrono::milliseconds(o.timeout_ms));
    gloo::barrier(closing);
    std::printf("done\n");
    return mismatches == 0 ? 0 : 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    std::fflush(stderr);
    // Gloo's background loop may still hold threads; leave without running their destructors.
    std::_Exit(1);
  }
}
