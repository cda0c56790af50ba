// Real links in the node's network namespace and in namespaces made here: these tests need root
// (CAP_NET_ADMIN) and skip otherwise. Names carry the test process's pid and addresses come from
// 10.250.0.0/16, which nothing else on a test node uses; TearDown deletes what a test made.
#include "runtime/process/netlink.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/process/test_util/shell.h"

namespace kiln::runtime::netlink {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

using kiln::runtime::test_util::Shell;

ino_t NetnsInode(const char* path) {
  struct stat st {};
  if (stat(path, &st) != 0) return 0;
  return st.st_ino;
}

// Runs `fn` on a fresh thread inside namespace `fd` (setns affects only that thread).
void InNamespace(int fd, const std::function<void()>& fn) {
  std::thread t([&] {
    ASSERT_EQ(setns(fd, CLONE_NEWNET), 0) << strerror(errno);
    fn();
  });
  t.join();
}

// A new, empty network namespace, held only by the returned fd (it vanishes when that closes).
int NewNamespace() {
  int fd = -1;
  std::thread t([&] {
    if (unshare(CLONE_NEWNET) != 0) return;
    fd = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
  });
  t.join();
  return fd;
}

bool LinkExists(const std::string& name) { return LinkAlias(name).ok(); }

class NetlinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root (CAP_NET_ADMIN)";
    suffix_ = std::to_string(getpid() % 100000);
    // Root without CAP_NET_ADMIN (a container): nothing to test here.
    std::string probe = Name("p");
    if (CreateBridge(probe, "", 0, "").code() == StatusCode::kPermissionDenied) GTEST_SKIP() << "no CAP_NET_ADMIN";
    (void)DeleteLink(probe);
  }
  void TearDown() override {
    for (const std::string& name : made_) (void)DeleteLink(name);
    for (int fd : namespaces_) close(fd);
  }
  std::string Name(const std::string& stem) {
    made_.push_back("knt" + stem + suffix_);
    return made_.back();
  }
  int Namespace() {
    int fd = NewNamespace();
    if (fd >= 0) namespaces_.push_back(fd);
    return fd;
  }

  std::string suffix_;
  std::vector<std::string> made_;
  std::vector<int> namespaces_;
};

TEST_F(NetlinkTest, BridgeCreateAliasAddressesDelete) {
  std::string br = Name("b");
  ASSERT_TRUE(CreateBridge(br, "10.250.1.1", 24, "kiln /nowhere test-net").ok());
  EXPECT_EQ(LinkAlias(br).value_or("?"), "kiln /nowhere test-net");
  EXPECT_THAT(LinkAddresses(br).value_or({}), ElementsAre("10.250.1.1/24"));
  auto links = ListLinks("knt");
  ASSERT_TRUE(links.ok());
  EXPECT_NE(std::find(links->begin(), links->end(), br), links->end());
  auto node = NodeAddresses();
  ASSERT_TRUE(node.ok());
  EXPECT_NE(std::find(node->begin(), node->end(), "10.250.1.1/24"), node->end());

  // Ports must forward at once: no STP, no forward delay.
  std::string details = Shell("ip -d link show " + br);
  EXPECT_THAT(details, HasSubstr("forward_delay 0 "));
  EXPECT_THAT(details, HasSubstr("stp_state 0 "));
  EXPECT_THAT(details, HasSubstr(",UP"));  // administratively up (no ports: no carrier yet)

  Status again = CreateBridge(br, "10.250.1.1", 24, "kiln other");
  EXPECT_TRUE(again.IsAlreadyExists()) << again.ToString();
  EXPECT_EQ(LinkAlias(br).value_or("?"), "kiln /nowhere test-net");  // the owner's alias is untouched

  ASSERT_TRUE(DeleteLink(br).ok());
  EXPECT_TRUE(LinkAlias(br).status().IsNotFound());
  EXPECT_TRUE(LinkAddresses(br).status().IsNotFound());
  EXPECT_TRUE(DeleteLink(br).ok());  // absent: Ok
}

TEST_F(NetlinkTest, BridgeWithoutAddressAndBadNames) {
  std::string br = Name("n");
  ASSERT_TRUE(CreateBridge(br, "", 0, "").ok());
  EXPECT_TRUE(LinkAddresses(br).value_or({"x"}).empty());
  EXPECT_EQ(LinkAlias(br).value_or("?"), "");
  EXPECT_TRUE(CreateBridge("this-name-is-too-long", "", 0, "").IsInvalidArgument());
  // A failing step after the creation (a bad address) deletes the bridge again.
  std::string bad = Name("x");
  Status st = CreateBridge(bad, "10.250.300.1", 24, "");
  EXPECT_FALSE(st.ok());
  EXPECT_FALSE(LinkExists(bad));
}

TEST_F(NetlinkTest, ConnectNamespaceGivesAddressRouteAndReachesGateway) {
  std::string br = Name("c");
  ASSERT_TRUE(CreateBridge(br, "10.250.2.1", 24, "").ok());
  int ns = Namespace();
  ASSERT_GE(ns, 0);

  // A listener on the gateway address in the node's namespace.
  int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  inet_pton(AF_INET, "10.250.2.1", &addr.sin_addr);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << strerror(errno);
  ASSERT_EQ(listen(listener, 4), 0);
  socklen_t len = sizeof(addr);
  getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);

  NetworkAttachment a;
  a.bridge = br;
  a.host_veth = Name("v");
  a.address = "10.250.2.2";
  a.prefix_length = 24;
  a.gateway = "10.250.2.1";
  ino_t before = NetnsInode("/proc/thread-self/ns/net");
  Status st = ConnectNamespace(ns, a);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(NetnsInode("/proc/thread-self/ns/net"), before);  // back in our own namespace

  EXPECT_THAT(Shell("ip -d link show " + a.host_veth), HasSubstr("master " + br));
  EXPECT_THAT(Shell("ip link show " + a.host_veth), HasSubstr("state UP"));

  InNamespace(ns, [&] {
    EXPECT_THAT(LinkAddresses("eth0").value_or({}), ElementsAre("10.250.2.2/24"));
    EXPECT_THAT(Shell("ip link show lo"), HasSubstr("UP"));
    // /proc/thread-self/net is this thread's namespace: the default route via 10.250.2.1.
    std::ifstream routes("/proc/thread-self/net/route");
    std::string text((std::istreambuf_iterator<char>(routes)), std::istreambuf_iterator<char>());
    EXPECT_THAT(text, HasSubstr("eth0\t00000000\t0102FA0A")) << text;

    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(s, 0);
    EXPECT_EQ(connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << strerror(errno);
    close(s);
  });
  sockaddr_in peer{};
  socklen_t plen = sizeof(peer);
  int conn = accept(listener, reinterpret_cast<sockaddr*>(&peer), &plen);
  ASSERT_GE(conn, 0);
  char text[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &peer.sin_addr, text, sizeof(text));
  EXPECT_STREQ(text, "10.250.2.2");
  close(conn);
  close(listener);

  // The namespace's last reference goes: its veth, and so the host end, vanish with it.
  close(ns);
  namespaces_.clear();
  bool gone = false;
  for (int i = 0; i < 500 && !gone; ++i) {
    gone = !LinkExists(a.host_veth);
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(gone) << a.host_veth << " outlived its namespace";
}

TEST_F(NetlinkTest, ConnectNamespaceIsolatedHasNoDefaultRoute) {
  std::string br = Name("i");
  ASSERT_TRUE(CreateBridge(br, "10.250.3.1", 24, "").ok());
  int ns = Namespace();
  ASSERT_GE(ns, 0);
  NetworkAttachment a;
  a.bridge = br;
  a.host_veth = Name("w");
  a.address = "10.250.3.7";
  a.gateway = "10.250.3.1";
  a.isolated = true;
  a.interface_name = "net0";
  ASSERT_TRUE(ConnectNamespace(ns, a).ok());
  InNamespace(ns, [&] {
    EXPECT_THAT(LinkAddresses("net0").value_or({}), ElementsAre("10.250.3.7/24"));
    std::ifstream routes("/proc/thread-self/net/route");
    std::string text((std::istreambuf_iterator<char>(routes)), std::istreambuf_iterator<char>());
    EXPECT_THAT(text, ::testing::Not(HasSubstr("\t00000000\t0103FA0A"))) << text;
    EXPECT_THAT(text, HasSubstr("net0\t0003FA0A\t00000000")) << text;  // the subnet itself
  });
}

TEST_F(NetlinkTest, ConnectNamespaceFailureLeavesNothingBehind) {
  int ns = Namespace();
  ASSERT_GE(ns, 0);
  ino_t before = NetnsInode("/proc/thread-self/ns/net");

  NetworkAttachment a;
  a.bridge = Name("m");  // never created
  a.host_veth = Name("f");
  a.address = "10.250.4.2";
  a.gateway = "10.250.4.1";
  Status st = ConnectNamespace(ns, a);
  EXPECT_TRUE(st.IsNotFound()) << st.ToString();
  EXPECT_FALSE(LinkExists(a.host_veth));

  // Fails inside the namespace (an unparsable gateway, after the address is set): the host end
  // is deleted and the thread is back home.
  std::string br = Name("g");
  ASSERT_TRUE(CreateBridge(br, "10.250.4.1", 24, "").ok());
  a.bridge = br;
  a.gateway = "not-an-address";
  st = ConnectNamespace(ns, a);
  EXPECT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr("not-an-address"));
  EXPECT_FALSE(LinkExists(a.host_veth));
  EXPECT_EQ(NetnsInode("/proc/thread-self/ns/net"), before);

  // A second try with the same names works (nothing stale is in the way).
  a.gateway = "10.250.4.1";
  st = ConnectNamespace(ns, a);
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(LinkExists(a.host_veth));
}

TEST_F(NetlinkTest, ConnectNamespaceReplacesAStaleHostEnd) {
  std::string br = Name("s");
  ASSERT_TRUE(CreateBridge(br, "10.250.5.1", 24, "").ok());
  int first = Namespace();
  int second = Namespace();
  ASSERT_GE(first, 0);
  ASSERT_GE(second, 0);
  NetworkAttachment a;
  a.bridge = br;
  a.host_veth = Name("r");
  a.address = "10.250.5.2";
  a.gateway = "10.250.5.1";
  ASSERT_TRUE(ConnectNamespace(first, a).ok());
  // The lease's earlier holder is still around (its namespace not yet torn down).
  Status st = ConnectNamespace(second, a);
  ASSERT_TRUE(st.ok()) << st.ToString();
  InNamespace(second, [&] { EXPECT_THAT(LinkAddresses("eth0").value_or({}), ElementsAre("10.250.5.2/24")); });
  InNamespace(first, [&] { EXPECT_TRUE(LinkAlias("eth0").status().IsNotFound()); });
}

}  // namespace
}  // namespace kiln::runtime::netlink
