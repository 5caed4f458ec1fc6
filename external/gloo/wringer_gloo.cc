// wringer-gloo: a small driver for the real Gloo (Debian's libgloo-dev), so wringer's exec
// scenarios can put Gloo's TCP transport under faults. Every rank connects a full mesh through a
// FileStore, then runs ring allreduces, checks every element, and prints what it measured as
// `key=value` lines on stdout. Any Gloo error is printed as `error: ...` and exits 1.
//
//   wringer-gloo --rank R --size N --store DIR --host IP [--prefix P] [--timeout-ms T]
//                [--rounds K] [--sizes 64,4096,...] [--until-error]
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
#include <string>
#include <thread>
#include <vector>

#include <gloo/allreduce_ring.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

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
    gloo::rendezvous::FileStore file_store(o.store);
    gloo::rendezvous::PrefixStore store(o.prefix, file_store);
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
    std::printf("done\n");
    return mismatches == 0 ? 0 : 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    std::fflush(stderr);
    // Gloo's background loop may still hold threads; leave without running their destructors.
    std::_Exit(1);
  }
}
