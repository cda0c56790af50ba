// BridgeNetworks on real bridges and a real nftables table: needs root (skips otherwise). Each
// test has a cidr of its own in 10.251.0.0-10.254.255.255 and a fresh state dir, and TearDown
// removes every network and bridge it made (Sweep with no live instances, then any bridge left
// whose alias names the test's dirs). Other Kiln servers on the node may hold kb-* bridges
// meanwhile: the tests never assume which subnet index they get, only that it is in the range.
#include "runtime/process/bridge_networks.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/fs.h"
#include "base/hash.h"
#include "runtime/process/netlink.h"
#include "runtime/process/test_util/shell.h"

namespace kiln::runtime {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

using kiln::runtime::test_util::Shell;

uint32_t Ip(const std::string& text) {
  in_addr a{};
  inet_pton(AF_INET, text.c_str(), &a);
  return ntohl(a.s_addr);
}

// True when "a.b.c.d/len" lies in `cidr` and is not its first block of that size.
bool InRangeNotFirst(const std::string& subnet, const std::string& cidr) {
  auto slash = cidr.find('/');
  uint32_t base = Ip(cidr.substr(0, slash));
  int prefix = std::stoi(cidr.substr(slash + 1));
  uint32_t mask = prefix == 0 ? 0 : ~uint32_t{0} << (32 - prefix);
  uint32_t s = Ip(subnet.substr(0, subnet.find('/')));
  int sub_prefix = std::stoi(subnet.substr(subnet.find('/') + 1));
  uint32_t first_end = base + (uint32_t{1} << (32 - sub_prefix));
  return (s & mask) == base && s >= first_end;
}

std::string MakeTempDir() {
  char tmpl[] = "/tmp/kiln-bn-XXXXXX";
  char* dir = mkdtemp(tmpl);
  return dir != nullptr ? std::filesystem::weakly_canonical(dir).string() : "";
}

// A new, empty network namespace held only by the returned fd (-1 on failure).
int NewNamespace() {
  int fd = -1;
  std::thread t([&] {
    if (unshare(CLONE_NEWNET) == 0) fd = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
  });
  t.join();
  return fd;
}

// Runs `fn` on a thread inside namespace `ns` (-1: the node's own).
template <typename Fn>
void InNamespace(int ns, Fn fn) {
  std::thread t([&] {
    if (ns >= 0 && setns(ns, CLONE_NEWNET) != 0) {
      ADD_FAILURE() << "setns: " << strerror(errno);
      return;
    }
    fn();
  });
  t.join();
}

sockaddr_in SockAddr(const std::string& ip, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, ip.c_str(), &a.sin_addr);
  return a;
}

// A TCP listener on `ip` (port chosen by the kernel) inside namespace `ns`; the socket stays in
// that namespace. Returns {fd, port}.
std::pair<int, int> Listen(int ns, const std::string& ip) {
  int fd = -1, port = 0;
  InNamespace(ns, [&] {
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a = SockAddr(ip, 0);
    socklen_t len = sizeof(a);
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(fd, 8) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      ADD_FAILURE() << "listen on " << ip << ": " << strerror(errno);
      return;
    }
    port = ntohs(a.sin_port);
  });
  return {fd, port};
}

// Whether a TCP connection from namespace `ns` to ip:port is established within `wait_ms`. A
// dropped SYN is never answered, so a refused path takes the whole wait; an allowed one takes
// a round trip on the node.
bool Connects(int ns, const std::string& ip, int port, int wait_ms) {
  bool ok = false;
  InNamespace(ns, [&] {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    sockaddr_in a = SockAddr(ip, port);
    int rc = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    if (rc == 0) {
      ok = true;
    } else if (errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      if (poll(&p, 1, wait_ms) == 1) {
        int err = 0;
        socklen_t len = sizeof(err);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        ok = err == 0;
      }
    }
    close(fd);
  });
  return ok;
}

std::string TableOf(const std::string& state_dir) { return "kiln_" + Sha256Hex(state_dir).substr(0, 8); }

class BridgeNetworksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root (CAP_NET_ADMIN)";
    // Root without CAP_NET_ADMIN (a container): nothing to test here.
    std::string probe = "kbnp" + std::to_string(getpid() % 1000000);
    if (netlink::CreateBridge(probe, "", 0, "").code() == StatusCode::kPermissionDenied) {
      GTEST_SKIP() << "no CAP_NET_ADMIN";
    }
    (void)netlink::DeleteLink(probe);
    // Bridge names kb-<index> are node-wide whatever the range (that is how servers share a node),
    // and ctest runs these tests in parallel processes: one test's claim of an index would race
    // another's expectations (EnsureMovesANetworkWhoseIndexWasTaken recreates a bridge by name).
    // One test at a time, across processes.
    lock_fd_ = open("/tmp/kiln-bridge-networks-test.lock", O_CREAT | O_RDWR | O_CLOEXEC, 0600);
    ASSERT_GE(lock_fd_, 0) << std::strerror(errno);
    ASSERT_EQ(flock(lock_fd_, LOCK_EX), 0) << std::strerror(errno);
  }
  void TearDown() override {
    CleanUp();
    if (lock_fd_ >= 0) close(lock_fd_);  // releases the lock
    lock_fd_ = -1;
  }
  void CleanUp() {
    for (auto& n : opened_) (void)n->Sweep({});
    opened_.clear();
    // Anything still named after one of our dirs (a failed test's leftovers, hand-made orphans).
    for (const std::string& bridge : netlink::ListLinks("kb-").value_or({})) {
      std::string alias = netlink::LinkAlias(bridge).value_or("");
      for (const std::string& dir : dirs_) {
        if (alias.rfind("kiln " + dir, 0) == 0) (void)netlink::DeleteLink(bridge);
      }
    }
    for (const std::string& dir : dirs_) {
      Shell("nft delete table inet " + TableOf(dir));
      (void)RemoveAll(dir);
    }
  }

  std::string Dir() {
    dirs_.push_back(MakeTempDir());
    return dirs_.back();
  }

  // Opens networks on `cidr`; the object is kept for TearDown, the pointer returned.
  InstanceNetworks* Open(const std::string& state_dir, const std::string& cidr, int prefix = 24, bool firewall = true) {
    BridgeNetworksOptions options;
    options.state_dir = state_dir;
    options.cidr = cidr;
    options.subnet_prefix = prefix;
    options.firewall = firewall;
    auto n = OpenBridgeNetworks(options);
    EXPECT_TRUE(n.ok()) << n.status().ToString();
    if (!n.ok()) return nullptr;
    opened_.push_back(std::move(n).value());
    return opened_.back().get();
  }

  std::vector<std::string> dirs_;
  std::vector<std::unique_ptr<InstanceNetworks>> opened_;
  int lock_fd_ = -1;  // flock held from SetUp to TearDown (see SetUp)
};

TEST_F(BridgeNetworksTest, OpenRejectsBadRanges) {
  std::string dir = Dir();
  for (auto [cidr, prefix] : std::vector<std::pair<std::string, int>>{{"10.251.0.0", 24},
                                                                      {"10.251.0.1/16", 24},
                                                                      {"300.0.0.0/8", 24},
                                                                      {"10.251.0.0/16", 30},
                                                                      {"10.251.0.0/16", 12},
                                                                      {"10.251.0.0/24", 24}}) {
    BridgeNetworksOptions options;
    options.state_dir = dir;
    options.cidr = cidr;
    options.subnet_prefix = prefix;
    auto n = OpenBridgeNetworks(options);
    ASSERT_FALSE(n.ok()) << cidr << " " << prefix;
    EXPECT_EQ(n.status().code(), StatusCode::kFailedPrecondition) << n.status().ToString();
    EXPECT_THAT(n.status().message(), HasSubstr("network.")) << n.status().ToString();
  }
}

TEST_F(BridgeNetworksTest, OpenWithoutNetAdminSaysWhatToChange) {
  std::string dir = Dir();
  Result<std::unique_ptr<InstanceNetworks>> opened = Status::Internal("not run");
  // Capabilities are per thread: this one drops CAP_NET_ADMIN from its effective set.
  std::thread t([&] {
    __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct data[2] = {};
    ASSERT_EQ(syscall(SYS_capget, &header, data), 0);
    data[0].effective &= ~(1u << CAP_NET_ADMIN);
    ASSERT_EQ(syscall(SYS_capset, &header, data), 0) << strerror(errno);
    BridgeNetworksOptions options;
    options.state_dir = dir;
    options.cidr = "10.251.0.0/16";
    opened = OpenBridgeNetworks(options);
  });
  t.join();
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), StatusCode::kFailedPrecondition) << opened.status().ToString();
  EXPECT_THAT(opened.status().message(), HasSubstr("CAP_NET_ADMIN"));
  EXPECT_THAT(opened.status().message(), HasSubstr("network.mode: host"));
}

TEST_F(BridgeNetworksTest, EnsureIsIdempotentAndChecksIsolation) {
  std::string dir = Dir();
  InstanceNetworks* nets = Open(dir, "10.251.0.0/16");
  ASSERT_NE(nets, nullptr);
  auto a = nets->Ensure("training-a", false);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_THAT(a->bridge, StartsWith("kb-"));
  EXPECT_TRUE(InRangeNotFirst(a->subnet, "10.251.0.0/16")) << a->subnet;
  EXPECT_EQ(a->prefix_length, 24);
  EXPECT_FALSE(a->isolated);
  EXPECT_EQ(a->gateway, a->subnet.substr(0, a->subnet.rfind('.')) + ".1");
  EXPECT_EQ(netlink::LinkAlias(a->bridge).value_or(""), "kiln " + dir + " training-a");
  EXPECT_EQ(netlink::LinkAddresses(a->bridge).value_or({}), std::vector<std::string>{a->gateway + "/24"});
  EXPECT_TRUE(PathExists(dir + "/training-a.json"));

  auto again = nets->Ensure("training-a", false);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->bridge, a->bridge);
  EXPECT_EQ(again->subnet, a->subnet);

  auto mismatch = nets->Ensure("training-a", true);
  EXPECT_EQ(mismatch.status().code(), StatusCode::kFailedPrecondition) << mismatch.status().ToString();

  auto b = nets->Ensure("training-b", true);
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE(b->isolated);
  EXPECT_NE(b->subnet, a->subnet);
  EXPECT_NE(b->bridge, a->bridge);

  EXPECT_TRUE(nets->Ensure("bad name", false).status().IsInvalidArgument());
  EXPECT_TRUE(nets->Ensure("", false).status().IsInvalidArgument());

  // A deleted bridge is made again on Ensure.
  ASSERT_TRUE(netlink::DeleteLink(a->bridge).ok());
  auto remade = nets->Ensure("training-a", false);
  ASSERT_TRUE(remade.ok()) << remade.status().ToString();
  EXPECT_TRUE(netlink::LinkAlias(remade->bridge).ok());
}

TEST_F(BridgeNetworksTest, ExhaustedRangeSaysWhatToWiden) {
  InstanceNetworks* nets = Open(Dir(), "10.252.0.0/22");  // 4 blocks, the first never used
  ASSERT_NE(nets, nullptr);
  int made = 0;
  Status last;
  for (int i = 0; i < 4 && last.ok(); ++i) {
    auto r = nets->Ensure("n" + std::to_string(i), false);
    if (r.ok()) ++made;
    last = r.status();
  }
  EXPECT_LE(made, 3);
  EXPECT_EQ(last.code(), StatusCode::kResourceExhausted) << last.ToString();
  EXPECT_THAT(last.message(), HasSubstr("network.cidr"));
}

TEST_F(BridgeNetworksTest, AttachLeasesLowestFreeAddressAndIsIdempotent) {
  InstanceNetworks* nets = Open(Dir(), "10.253.0.0/16");
  ASSERT_NE(nets, nullptr);
  auto info = nets->Ensure("training-att", false);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  std::string stem = info->subnet.substr(0, info->subnet.rfind('.') + 1);
  std::string index = info->bridge.substr(3);

  auto one = nets->Attach("training-att", "job-algo-1", {8080, 9000});
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_EQ(one->address, stem + "2");
  EXPECT_EQ(one->network, "training-att");
  EXPECT_EQ(one->bridge, info->bridge);
  EXPECT_EQ(one->host_veth, "kv" + index + "-2");
  EXPECT_EQ(one->gateway, info->gateway);
  EXPECT_EQ(one->prefix_length, 24);
  EXPECT_FALSE(one->isolated);
  EXPECT_EQ(one->interface_name, "eth0");
  EXPECT_EQ(one->loopback_forwards, (std::vector<int>{8080, 9000}));

  auto two = nets->Attach("training-att", "job-algo-2", {});
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(two->address, stem + "3");
  EXPECT_EQ(nets->Attach("training-att", "job-algo-1", {})->address, stem + "2");

  ASSERT_TRUE(nets->Detach("training-att", "job-algo-1").ok());
  EXPECT_TRUE(nets->Detach("training-att", "job-algo-1").ok());  // no lease: Ok
  EXPECT_TRUE(nets->Detach("no-such-network", "x").ok());
  // Addresses rotate: the just-freed .2 is not leased again at once (a new instance would
  // inherit the host's neighbour entry of the old one), the next ones are.
  EXPECT_EQ(nets->Attach("training-att", "job-algo-3", {})->address, stem + "4");
  EXPECT_EQ(nets->Attach("training-att", "job-algo-4", {})->address, stem + "5");

  EXPECT_TRUE(nets->Attach("no-such-network", "x", {}).status().IsNotFound());

  // Isolated networks carry no loopback forwards.
  ASSERT_TRUE(nets->Ensure("training-iso", true).ok());
  auto iso = nets->Attach("training-iso", "iso-1", {8080});
  ASSERT_TRUE(iso.ok());
  EXPECT_TRUE(iso->isolated);
  EXPECT_TRUE(iso->loopback_forwards.empty());
}

TEST_F(BridgeNetworksTest, FullSubnetIsResourceExhausted) {
  InstanceNetworks* nets = Open(Dir(), "10.254.0.0/20", 28);  // .2 .. .14: 13 leases
  ASSERT_NE(nets, nullptr);
  ASSERT_TRUE(nets->Ensure("small", false).ok());
  for (int i = 0; i < 13; ++i) ASSERT_TRUE(nets->Attach("small", "i" + std::to_string(i), {}).ok()) << i;
  auto full = nets->Attach("small", "i13", {});
  EXPECT_EQ(full.status().code(), StatusCode::kResourceExhausted) << full.status().ToString();
  EXPECT_THAT(full.status().message(), HasSubstr("network.subnet_prefix"));
}

TEST_F(BridgeNetworksTest, LeasesSurviveAReopen) {
  std::string dir = Dir();
  InstanceNetworks* first = Open(dir, "10.251.0.0/16");
  ASSERT_NE(first, nullptr);
  auto info = first->Ensure("endpoint-e", false);
  ASSERT_TRUE(info.ok());
  auto a = first->Attach("endpoint-e", "e-1", {});
  auto b = first->Attach("endpoint-e", "e-2", {});
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(first->Detach("endpoint-e", "e-1").ok());
  opened_.clear();  // the server goes away; its bridge stays

  InstanceNetworks* second = Open(dir, "10.251.0.0/16");
  ASSERT_NE(second, nullptr);
  auto again = second->Ensure("endpoint-e", false);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->bridge, info->bridge);
  EXPECT_EQ(second->Attach("endpoint-e", "e-2", {})->address, b->address);
  EXPECT_EQ(second->Attach("endpoint-e", "e-3", {})->address, a->address);
}

TEST_F(BridgeNetworksTest, RemoveDeletesBridgeStateAndRules) {
  std::string dir = Dir();
  InstanceNetworks* nets = Open(dir, "10.252.0.0/16");
  ASSERT_NE(nets, nullptr);
  auto keep = nets->Ensure("keep", false);
  auto gone = nets->Ensure("gone", true);
  ASSERT_TRUE(keep.ok() && gone.ok());
  std::string table = TableOf(dir);
  EXPECT_THAT(Shell("nft list table inet " + table), HasSubstr("\"" + gone->bridge + "\""));

  ASSERT_TRUE(nets->Remove("gone").ok());
  EXPECT_TRUE(netlink::LinkAlias(gone->bridge).status().IsNotFound() ||
              netlink::LinkAlias(gone->bridge).value_or("").rfind("kiln " + dir + " ", 0) != 0);
  EXPECT_FALSE(PathExists(dir + "/gone.json"));
  std::string rules = Shell("nft list table inet " + table);
  EXPECT_THAT(rules, Not(HasSubstr("\"" + gone->bridge + "\"")));
  EXPECT_THAT(rules, HasSubstr("\"" + keep->bridge + "\""));
  EXPECT_TRUE(nets->Remove("gone").ok());  // absent: Ok

  // The last network takes the table with it.
  ASSERT_TRUE(nets->Remove("keep").ok());
  EXPECT_THAT(Shell("nft list tables"), Not(HasSubstr(table)));
}

TEST_F(BridgeNetworksTest, FirewallTableHoldsTheIsolationRules) {
  std::string dir = Dir();
  InstanceNetworks* nets = Open(dir, "10.253.0.0/16");
  ASSERT_NE(nets, nullptr);
  auto open = nets->Ensure("open", false);
  auto iso = nets->Ensure("iso", true);
  ASSERT_TRUE(open.ok() && iso.ok());
  std::string rules = Shell("nft list table inet " + TableOf(dir));
  std::string o = "\"" + open->bridge + "\"";
  std::string i = "\"" + iso->bridge + "\"";
  // Between Kiln bridges: dropped.
  EXPECT_THAT(rules, HasSubstr("iifname " + o + " oifname \"kb-*\" oifname != " + o + " drop")) << rules;
  EXPECT_THAT(rules, HasSubstr("oifname " + o + " iifname \"kb-*\" iifname != " + o + " drop")) << rules;
  // Isolated: nothing routed in or out, no new connections to the node.
  EXPECT_THAT(rules, HasSubstr("iifname " + i + " oifname != " + i + " drop")) << rules;
  EXPECT_THAT(rules, HasSubstr("oifname " + i + " iifname != " + i + " drop")) << rules;
  EXPECT_THAT(rules, HasSubstr("iifname " + i + " ct state established,related accept")) << rules;
  EXPECT_THAT(rules, HasSubstr("hook input"));
  // Masquerading for the open subnet only.
  EXPECT_THAT(rules, HasSubstr("ip saddr " + open->subnet + " oifname != \"kb-*\" masquerade")) << rules;
  EXPECT_THAT(rules, Not(HasSubstr("ip saddr " + iso->subnet))) << rules;
}

TEST_F(BridgeNetworksTest, WithoutFirewallNoTable) {
  std::string dir = Dir();
  InstanceNetworks* nets = Open(dir, "10.254.0.0/16", 24, /*firewall=*/false);
  ASSERT_NE(nets, nullptr);
  ASSERT_TRUE(nets->Ensure("plain", true).ok());
  EXPECT_THAT(Shell("nft list tables"), Not(HasSubstr(TableOf(dir))));
}

TEST_F(BridgeNetworksTest, TwoServersOnOneRangeGetDifferentSubnets) {
  InstanceNetworks* x = Open(Dir(), "10.254.0.0/16");
  InstanceNetworks* y = Open(Dir(), "10.254.0.0/16");
  ASSERT_NE(x, nullptr);
  ASSERT_NE(y, nullptr);
  auto a = x->Ensure("same-name", false);
  auto b = y->Ensure("same-name", false);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->subnet, b->subnet);
  EXPECT_NE(a->bridge, b->bridge);
  // Each Sweeps only its own.
  auto swept = y->Sweep({});
  ASSERT_TRUE(swept.ok());
  EXPECT_EQ(*swept, std::set<std::string>{"same-name"});
  EXPECT_TRUE(netlink::LinkAlias(a->bridge).ok());
}

TEST_F(BridgeNetworksTest, SweepRemovesDeadNetworksAndOrphans) {
  std::string dir = Dir();
  std::string other_live = Dir();
  InstanceNetworks* nets = Open(dir, "10.252.0.0/16");
  ASSERT_NE(nets, nullptr);
  auto live = nets->Ensure("live", false);
  auto dead = nets->Ensure("dead", false);
  auto empty = nets->Ensure("empty", true);
  ASSERT_TRUE(live.ok() && dead.ok() && empty.ok());
  ASSERT_TRUE(nets->Attach("live", "alive-1", {}).ok());
  auto stale = nets->Attach("live", "dead-1", {});
  ASSERT_TRUE(stale.ok());
  ASSERT_TRUE(nets->Attach("dead", "dead-2", {}).ok());

  // Orphans by hand, on indexes nobody uses: one of ours that no network holds, one of a server
  // whose dir is gone, one of a live other server (kept).
  std::string suffix = std::to_string(getpid() % 100000);
  std::string ours = "kb-7" + suffix, gone = "kb-8" + suffix, theirs = "kb-9" + suffix;
  ASSERT_TRUE(netlink::CreateBridge(ours, "", 0, "kiln " + dir + " lost").ok());
  ASSERT_TRUE(netlink::CreateBridge(gone, "", 0, "kiln " + dir + "-deleted-dir x").ok());
  ASSERT_TRUE(netlink::CreateBridge(theirs, "", 0, "kiln " + other_live + " y").ok());

  auto swept = nets->Sweep({"alive-1", "unrelated"});
  ASSERT_TRUE(swept.ok()) << swept.status().ToString();
  EXPECT_EQ(*swept, (std::set<std::string>{"dead", "empty"}));
  EXPECT_TRUE(netlink::LinkAlias(live->bridge).ok());
  EXPECT_FALSE(netlink::LinkAlias(dead->bridge).value_or("").rfind("kiln " + dir + " ", 0) == 0);
  EXPECT_FALSE(PathExists(dir + "/dead.json"));
  EXPECT_FALSE(PathExists(dir + "/empty.json"));
  EXPECT_TRUE(netlink::LinkAlias(ours).status().IsNotFound());
  EXPECT_TRUE(netlink::LinkAlias(gone).status().IsNotFound());
  EXPECT_TRUE(netlink::LinkAlias(theirs).ok());
  (void)netlink::DeleteLink(theirs);

  // The dead lease is dropped (attaching its id again leases a new address, not its old one);
  // the live one is kept.
  EXPECT_EQ(nets->Attach("live", "alive-1", {})->address.substr(live->gateway.rfind('.')), ".2");
  EXPECT_NE(nets->Attach("live", "dead-1", {})->address, stale->address);
  EXPECT_THAT(Shell("nft list table inet " + TableOf(dir)), Not(HasSubstr("\"" + dead->bridge + "\"")));
}

TEST_F(BridgeNetworksTest, ServersOnDifferentRangesShareBridgeNames) {
  InstanceNetworks* x = Open(Dir(), "10.253.0.0/16");
  InstanceNetworks* y = Open(Dir(), "10.254.0.0/16");
  ASSERT_NE(x, nullptr);
  ASSERT_NE(y, nullptr);
  auto a = x->Ensure("range-x", false);
  ASSERT_TRUE(a.ok());
  // y's lowest free index may be a's (its subnet is free in y's range) but the name is taken:
  // y goes on to the next, and its subnet follows its bridge's index.
  auto b = y->Ensure("range-y", false);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_NE(a->bridge, b->bridge);
  for (const auto& info : {*a, *b}) {
    std::string index = info.bridge.substr(3);
    EXPECT_EQ(info.subnet.substr(info.subnet.find('.', 3) + 1), index + ".0/24") << info.subnet;
  }
}

TEST_F(BridgeNetworksTest, EnsureMovesANetworkWhoseIndexWasTaken) {
  std::string dir = Dir();
  InstanceNetworks* nets = Open(dir, "10.252.0.0/16");
  ASSERT_NE(nets, nullptr);
  auto first = nets->Ensure("moved", false);
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(nets->Attach("moved", "m-1", {}).ok());
  ASSERT_TRUE(nets->Attach("moved", "m-2", {}).ok());
  // The bridge vanished and someone else (another range) took its name meanwhile.
  ASSERT_TRUE(netlink::DeleteLink(first->bridge).ok());
  std::string other = Dir();
  ASSERT_TRUE(netlink::CreateBridge(first->bridge, "", 0, "kiln " + other + " theirs").ok());
  auto second = nets->Ensure("moved", false);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_NE(second->bridge, first->bridge);
  EXPECT_NE(second->subnet, first->subnet);
  EXPECT_EQ(netlink::LinkAlias(first->bridge).value_or(""), "kiln " + other + " theirs");  // untouched
  // The old leases are void: the next instance gets .2 of the new subnet.
  auto lease = nets->Attach("moved", "m-3", {});
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->address, second->gateway.substr(0, second->gateway.rfind('.')) + ".2");
  // Removing it deletes only its own bridge.
  ASSERT_TRUE(nets->Remove("moved").ok());
  EXPECT_TRUE(netlink::LinkAlias(first->bridge).ok());
  (void)netlink::DeleteLink(first->bridge);
}

TEST_F(BridgeNetworksTest, ConcurrentAttachesGetDistinctAddresses) {
  InstanceNetworks* nets = Open(Dir(), "10.253.0.0/16");
  ASSERT_NE(nets, nullptr);
  ASSERT_TRUE(nets->Ensure("busy", false).ok());
  std::vector<std::vector<std::string>> got(8);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 4; ++i) {
        auto a = nets->Attach("busy", "t" + std::to_string(t) + "-" + std::to_string(i), {});
        if (a.ok()) got[t].push_back(a->address);
      }
    });
  }
  for (auto& th : threads) th.join();
  std::set<std::string> all;
  for (const auto& v : got) all.insert(v.begin(), v.end());
  EXPECT_EQ(all.size(), 32u);
}

// The rules on real traffic between namespaces joined by ConnectNamespace (what the shim does).
TEST_F(BridgeNetworksTest, RulesHoldOnRealTraffic) {
  InstanceNetworks* nets = Open(Dir(), "10.251.0.0/16");
  ASSERT_NE(nets, nullptr);
  auto open = nets->Ensure("traffic-open", false);
  auto iso = nets->Ensure("traffic-iso", true);
  ASSERT_TRUE(open.ok() && iso.ok());

  std::vector<int> fds;
  auto join = [&](const std::string& network, const std::string& id) -> std::pair<int, std::string> {
    int ns = NewNamespace();
    EXPECT_GE(ns, 0);
    fds.push_back(ns);
    auto a = nets->Attach(network, id, {});
    EXPECT_TRUE(a.ok()) << a.status().ToString();
    if (!a.ok() || ns < 0) return {-1, ""};
    Status st = netlink::ConnectNamespace(ns, *a);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return {ns, a->address};
  };
  auto [a1, a1_ip] = join("traffic-open", "a1");
  auto [a2, a2_ip] = join("traffic-open", "a2");
  auto [i1, i1_ip] = join("traffic-iso", "i1");
  auto [i2, i2_ip] = join("traffic-iso", "i2");
  ASSERT_FALSE(a1_ip.empty() || a2_ip.empty() || i1_ip.empty() || i2_ip.empty());

  auto [l_a2, p_a2] = Listen(a2, a2_ip);
  auto [l_i1, p_i1] = Listen(i1, i1_ip);
  auto [l_i2, p_i2] = Listen(i2, i2_ip);
  auto [l_gw_open, p_gw_open] = Listen(-1, open->gateway);
  auto [l_gw_iso, p_gw_iso] = Listen(-1, iso->gateway);
  fds.insert(fds.end(), {l_a2, l_i1, l_i2, l_gw_open, l_gw_iso});

  constexpr int kAllowedMs = 5000, kRefusedMs = 500;
  EXPECT_TRUE(Connects(a1, a2_ip, p_a2, kAllowedMs)) << "hosts of one network";
  EXPECT_TRUE(Connects(i1, i2_ip, p_i2, kAllowedMs)) << "hosts of one isolated network";
  EXPECT_TRUE(Connects(a1, open->gateway, p_gw_open, kAllowedMs)) << "the node, from a non-isolated network";
  EXPECT_TRUE(Connects(-1, i1_ip, p_i1, kAllowedMs)) << "the node to an isolated instance";
  EXPECT_FALSE(Connects(i1, iso->gateway, p_gw_iso, kRefusedMs)) << "an isolated instance to the node";
  EXPECT_FALSE(Connects(a1, i1_ip, p_i1, kRefusedMs)) << "across networks";
  for (int fd : fds) close(fd);
}

// Forwarding on (which Kiln never turns on by itself) in a private "node" namespace, so that the
// forward and nat rules are what decides, and nothing of the real node is touched: the same two
// networks and an "uplink" network outside Kiln, first without the firewall (to show the paths
// exist), then with it.
TEST_F(BridgeNetworksTest, ForwardingNodeKeepsNetworksApartAndMasquerades) {
  std::string dirs[2] = {Dir(), Dir()};
  std::thread node([&] {
    ASSERT_EQ(unshare(CLONE_NEWNET), 0) << strerror(errno);
    {
      std::ofstream forward("/proc/sys/net/ipv4/ip_forward");  // this thread's namespace
      forward << "1\n";
      ASSERT_TRUE(forward.good());
    }
    // The uplink: a bridge with 192.168.77.1 and an "outside" host 192.168.77.2 that has no route
    // back to Kiln's range (it only answers masqueraded traffic).
    int outside = NewNamespace();
    ASSERT_GE(outside, 0);
    ASSERT_TRUE(netlink::CreateBridge("up0", "192.168.77.1", 24, "").ok());
    NetworkAttachment up;
    up.bridge = "up0";
    up.host_veth = "upv0";
    up.address = "192.168.77.2";
    up.gateway = "192.168.77.1";
    up.isolated = true;
    ASSERT_TRUE(netlink::ConnectNamespace(outside, up).ok());
    auto [l_out, p_out] = Listen(outside, "192.168.77.2");

    for (bool firewall : {false, true}) {
      SCOPED_TRACE(firewall ? "firewall" : "no firewall");
      BridgeNetworksOptions options;
      options.state_dir = dirs[firewall ? 1 : 0];
      options.cidr = "10.251.0.0/16";
      options.firewall = firewall;
      auto nets = OpenBridgeNetworks(options);
      ASSERT_TRUE(nets.ok()) << nets.status().ToString();
      ASSERT_TRUE((*nets)->Ensure("fwd-a", false).ok());
      ASSERT_TRUE((*nets)->Ensure("fwd-b", false).ok());
      int a1 = NewNamespace(), b1 = NewNamespace();
      ASSERT_GE(a1, 0);
      ASSERT_GE(b1, 0);
      auto at_a = (*nets)->Attach("fwd-a", "a1", {});
      auto at_b = (*nets)->Attach("fwd-b", "b1", {});
      ASSERT_TRUE(at_a.ok() && at_b.ok());
      ASSERT_TRUE(netlink::ConnectNamespace(a1, *at_a).ok());
      ASSERT_TRUE(netlink::ConnectNamespace(b1, *at_b).ok());
      auto [l_b1, p_b1] = Listen(b1, at_b->address);

      bool across = Connects(a1, at_b->address, p_b1, firewall ? 500 : 5000);
      EXPECT_EQ(across, !firewall) << "a1 -> b1 across two networks";
      bool out = Connects(a1, "192.168.77.2", p_out, firewall ? 5000 : 500);
      EXPECT_EQ(out, firewall) << "a1 -> the uplink (needs masquerading)";
      if (out) {
        sockaddr_in peer{};
        socklen_t len = sizeof(peer);
        int conn = accept4(l_out, reinterpret_cast<sockaddr*>(&peer), &len, SOCK_CLOEXEC);
        ASSERT_GE(conn, 0);
        char text[INET_ADDRSTRLEN] = {};
        inet_ntop(AF_INET, &peer.sin_addr, text, sizeof(text));
        EXPECT_STREQ(text, "192.168.77.1");  // masqueraded to the uplink's address
        close(conn);
      }
      EXPECT_TRUE((*nets)->Sweep({}).ok());
      for (int fd : {l_b1, a1, b1}) close(fd);
    }
    close(l_out);
    close(outside);
  });
  node.join();  // the private namespace, and all in it, goes with the thread
}

}  // namespace
}  // namespace kiln::runtime
