// Cost of the network steps on a job's start and end path, in a private network namespace (so the
// node's own links are untouched): creating a bridge, ConnectNamespace (veth into a fresh
// namespace, address, routes), Ensure of a new network with its nftables table, Attach, Remove,
// and deleting a link. Needs root. Usage:
//   runtime_process_network_benchmark [iterations]
#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "base/fs.h"
#include "runtime/process/bridge_networks.h"
#include "runtime/process/netlink.h"

namespace {

using kiln::runtime::NetworkAttachment;
namespace netlink = kiln::runtime::netlink;

double NowMicros() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void Print(const char* what, std::vector<double> v) {
  if (v.empty()) return;
  std::sort(v.begin(), v.end());
  std::printf("%-40s median %7.2f ms   p90 %7.2f ms   min %7.2f ms\n", what, v[v.size() / 2] / 1000,
              v[v.size() * 9 / 10] / 1000, v.front() / 1000);
}

int NewNamespace() {
  int fd = -1;
  std::thread t([&] {
    if (unshare(CLONE_NEWNET) == 0) fd = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
  });
  t.join();
  return fd;
}

int Run(int iterations) {
  std::vector<double> create, remove_link, connect, ensure, attach, remove;
  if (!netlink::CreateBridge("bench0", "10.77.0.1", 16, "").ok()) {
    std::fprintf(stderr, "cannot create bridges (root needed)\n");
    return 1;
  }
  for (int i = 0; i < iterations; ++i) {
    double t = NowMicros();
    if (!netlink::CreateBridge("bench1", "10.78.0.1", 24, "kiln bench").ok()) return 1;
    create.push_back(NowMicros() - t);
    t = NowMicros();
    (void)netlink::DeleteLink("bench1");
    remove_link.push_back(NowMicros() - t);

    int ns = NewNamespace();
    if (ns < 0) return 1;
    NetworkAttachment a;
    a.bridge = "bench0";
    a.host_veth = "benchv";
    a.address = "10.77.0.2";
    a.prefix_length = 16;
    a.gateway = "10.77.0.1";
    t = NowMicros();
    auto st = netlink::ConnectNamespace(ns, a);
    connect.push_back(NowMicros() - t);
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", st.ToString().c_str());
      return 1;
    }
    (void)netlink::DeleteLink("benchv");
    close(ns);
  }
  (void)netlink::DeleteLink("bench0");

  char tmpl[] = "/tmp/kiln-netbench-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return 1;
  kiln::runtime::BridgeNetworksOptions options;
  options.state_dir = tmpl;
  options.cidr = "10.79.0.0/16";
  double t = NowMicros();
  auto nets = kiln::runtime::OpenBridgeNetworks(options);
  double open_us = NowMicros() - t;
  if (!nets.ok()) {
    std::fprintf(stderr, "%s\n", nets.status().ToString().c_str());
    return 1;
  }
  int networks = std::min(iterations, 200);
  for (int i = 0; i < networks; ++i) {
    std::string name = "bench-" + std::to_string(i);
    t = NowMicros();
    if (!(*nets)->Ensure(name, i % 2 == 1).ok()) return 1;
    ensure.push_back(NowMicros() - t);
    t = NowMicros();
    if (!(*nets)->Attach(name, "algo-1", {8080}).ok()) return 1;
    attach.push_back(NowMicros() - t);
  }
  for (int i = 0; i < networks; ++i) {
    t = NowMicros();
    if (!(*nets)->Remove("bench-" + std::to_string(i)).ok()) return 1;
    remove.push_back(NowMicros() - t);
  }
  (void)kiln::RemoveAll(tmpl);

  std::printf("%d iterations; %d networks\n", iterations, networks);
  Print("netlink::CreateBridge", create);
  Print("netlink::DeleteLink (a bridge)", remove_link);
  Print("netlink::ConnectNamespace", connect);
  std::printf("%-40s %7.2f ms\n", "OpenBridgeNetworks (probe, table)", open_us / 1000);
  Print("Ensure (new network + rules)", ensure);
  Print("Attach (new lease)", attach);
  Print("Remove (bridge + rules)", remove);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int iterations = argc > 1 ? std::atoi(argv[1]) : 50;
  if (iterations < 1) iterations = 1;
  // Everything in a private network namespace of this thread's own: nothing of the node changes.
  int rc = 1;
  std::thread t([&] {
    if (unshare(CLONE_NEWNET) != 0) {
      std::perror("unshare(CLONE_NEWNET) (root needed)");
      return;
    }
    rc = Run(iterations);
  });
  t.join();
  return rc;
}
