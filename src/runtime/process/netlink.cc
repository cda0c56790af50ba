#include "runtime/process/netlink.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/if_link.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netlink/addr.h>
#include <netlink/errno.h>
#include <netlink/msg.h>
#include <netlink/netlink.h>
#include <netlink/route/addr.h>
#include <netlink/route/link.h>
#include <netlink/route/link/veth.h>
#include <netlink/route/route.h>
#include <netlink/socket.h>
#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

namespace kiln::runtime::netlink {
namespace {

// "<what>: <libnl's text> (libnl error N)". libnl folds the kernel's errno into its own codes
// (EEXIST → NLE_EXIST, ENODEV → NLE_OBJ_NOTFOUND, EPERM → NLE_PERM...); its text is the readable
// part.
Status NlError(const std::string& what, int err) {
  if (err < 0) err = -err;
  std::string msg = what + ": " + nl_geterror(err) + " (libnl error " + std::to_string(err) + ")";
  switch (err) {
    case NLE_EXIST: return Status::AlreadyExists(std::move(msg));
    case NLE_OBJ_NOTFOUND:
    case NLE_NODEV: return Status::NotFound(std::move(msg));
    case NLE_PERM:
    case NLE_NOACCESS:
      return Status::PermissionDenied(std::move(msg) + "; changing links needs CAP_NET_ADMIN (run Kiln as root)");
    default: return Status::Internal(std::move(msg));
  }
}

Status SysError(const std::string& what, int err) {
  return Status::Internal(what + ": " + std::strerror(err) + " (errno " + std::to_string(err) + ")");
}

struct SockDeleter {
  void operator()(nl_sock* s) const { nl_socket_free(s); }
};
struct LinkDeleter {
  void operator()(rtnl_link* l) const { rtnl_link_put(l); }
};
struct AddrDeleter {
  void operator()(rtnl_addr* a) const { rtnl_addr_put(a); }
};
struct NlAddrDeleter {
  void operator()(nl_addr* a) const { nl_addr_put(a); }
};
struct CacheDeleter {
  void operator()(nl_cache* c) const { nl_cache_free(c); }
};
struct RouteDeleter {
  void operator()(rtnl_route* r) const { rtnl_route_put(r); }
};
struct MsgDeleter {
  void operator()(nl_msg* m) const { nlmsg_free(m); }
};
using Sock = std::unique_ptr<nl_sock, SockDeleter>;
using Link = std::unique_ptr<rtnl_link, LinkDeleter>;
using Addr = std::unique_ptr<rtnl_addr, AddrDeleter>;
using NlAddr = std::unique_ptr<nl_addr, NlAddrDeleter>;
using Cache = std::unique_ptr<nl_cache, CacheDeleter>;
using Route = std::unique_ptr<rtnl_route, RouteDeleter>;
using Msg = std::unique_ptr<nl_msg, MsgDeleter>;

// A route netlink socket of the calling thread's current network namespace (a socket belongs to
// the namespace it was created in, whatever the thread does later).
Result<Sock> Connect() {
  Sock sk(nl_socket_alloc());
  if (!sk) return Status::Internal("netlink: allocating a socket failed (out of memory)");
  int err = nl_connect(sk.get(), NETLINK_ROUTE);
  if (err < 0) return NlError("netlink: connecting a NETLINK_ROUTE socket", err);
  return sk;
}

Result<Link> GetLink(nl_sock* sk, const std::string& name) {
  rtnl_link* link = nullptr;
  int err = rtnl_link_get_kernel(sk, 0, name.c_str(), &link);
  if (err < 0) {
    if (err == -NLE_OBJ_NOTFOUND || err == -NLE_NODEV) return Status::NotFound("link " + name + " does not exist");
    return NlError("netlink: looking up link " + name, err);
  }
  return Link(link);
}

Status CheckName(const std::string& name) {
  if (name.empty() || name.size() >= IFNAMSIZ || name.find_first_of("/ \t\n:") != std::string::npos) {
    return Status::InvalidArgument("link name \"" + name + "\" is not valid (1.." + std::to_string(IFNAMSIZ - 1) +
                                   " bytes, no '/', ':' or blanks)");
  }
  return Status::Ok();
}

Result<NlAddr> ParseIpv4(const std::string& address, int prefix_length) {
  in_addr a{};
  if (inet_pton(AF_INET, address.c_str(), &a) != 1) {
    return Status::InvalidArgument("\"" + address + "\" is not an IPv4 address");
  }
  if (prefix_length < 0 || prefix_length > 32) {
    return Status::InvalidArgument("prefix length " + std::to_string(prefix_length) + " is not in 0..32");
  }
  NlAddr addr(nl_addr_build(AF_INET, &a, sizeof(a)));
  if (!addr) return Status::Internal("netlink: allocating an address failed (out of memory)");
  nl_addr_set_prefixlen(addr.get(), prefix_length);
  return addr;
}

// Sets IFF_UP (and the alias when given) on link `name`.
Status SetUpAndAlias(nl_sock* sk, const std::string& name, const std::string* alias) {
  ASSIGN_OR_RETURN(Link orig, GetLink(sk, name));
  Link change(rtnl_link_alloc());
  if (!change) return Status::Internal("netlink: allocating a link failed (out of memory)");
  rtnl_link_set_flags(change.get(), IFF_UP);
  if (alias != nullptr) rtnl_link_set_ifalias(change.get(), alias->c_str());
  int err = rtnl_link_change(sk, orig.get(), change.get(), 0);
  if (err < 0) return NlError("netlink: bringing link " + name + " up", err);
  return Status::Ok();
}

Status AddAddress(nl_sock* sk, const std::string& link_name, const std::string& address, int prefix_length) {
  ASSIGN_OR_RETURN(Link link, GetLink(sk, link_name));
  ASSIGN_OR_RETURN(NlAddr local, ParseIpv4(address, prefix_length));
  Addr addr(rtnl_addr_alloc());
  if (!addr) return Status::Internal("netlink: allocating an address failed (out of memory)");
  rtnl_addr_set_ifindex(addr.get(), rtnl_link_get_ifindex(link.get()));
  rtnl_addr_set_family(addr.get(), AF_INET);
  int err = rtnl_addr_set_local(addr.get(), local.get());
  if (err < 0) return NlError("netlink: setting address " + address, err);
  rtnl_addr_set_prefixlen(addr.get(), prefix_length);
  err = rtnl_addr_add(sk, addr.get(), 0);
  if (err < 0) {
    return NlError("netlink: adding address " + address + "/" + std::to_string(prefix_length) + " to " + link_name,
                   err);
  }
  return Status::Ok();
}

Status DeleteLinkWith(nl_sock* sk, const std::string& name) {
  Link link(rtnl_link_alloc());
  if (!link) return Status::Internal("netlink: allocating a link failed (out of memory)");
  rtnl_link_set_name(link.get(), name.c_str());
  int err = rtnl_link_delete(sk, link.get());
  if (err < 0 && err != -NLE_OBJ_NOTFOUND && err != -NLE_NODEV) return NlError("netlink: deleting link " + name, err);
  return Status::Ok();
}

// Creates veth `host` <-> `peer`, the peer directly inside namespace `netns_fd` (so it never
// appears under its name in the node's namespace, where it could collide).
Status CreateVeth(nl_sock* sk, const std::string& host, const std::string& peer_name, int netns_fd) {
  Link link(rtnl_link_veth_alloc());
  if (!link) return Status::Internal("netlink: allocating a veth failed (out of memory)");
  rtnl_link_set_name(link.get(), host.c_str());
  Link peer(rtnl_link_veth_get_peer(link.get()));  // takes a reference
  rtnl_link_set_name(peer.get(), peer_name.c_str());
  rtnl_link_set_ns_fd(peer.get(), netns_fd);
  int err = rtnl_link_add(sk, link.get(), NLM_F_CREATE | NLM_F_EXCL);
  if (err < 0) return NlError("netlink: creating veth " + host + " (peer " + peer_name + " in the namespace)", err);
  return Status::Ok();
}

// Restores the calling thread's network namespace on scope exit (every return path of
// ConnectNamespace's inside part).
class NetnsGuard {
 public:
  explicit NetnsGuard(int original_fd) : fd_(original_fd) {}
  ~NetnsGuard() {
    if (entered_) (void)Restore();
  }
  NetnsGuard(const NetnsGuard&) = delete;
  NetnsGuard& operator=(const NetnsGuard&) = delete;
  void Entered() { entered_ = true; }
  Status Restore() {
    if (!entered_) return Status::Ok();
    entered_ = false;
    if (setns(fd_, CLONE_NEWNET) != 0) return SysError("netlink: setns back to the original network namespace", errno);
    return Status::Ok();
  }

 private:
  int fd_;
  bool entered_ = false;
};

// The steps inside the namespace; the caller's thread is already in it.
Status ConfigureInside(const NetworkAttachment& a) {
  ASSIGN_OR_RETURN(Sock sk, Connect());
  RETURN_IF_ERROR(AddAddress(sk.get(), a.interface_name, a.address, a.prefix_length));
  RETURN_IF_ERROR(SetUpAndAlias(sk.get(), a.interface_name, nullptr));
  RETURN_IF_ERROR(SetUpAndAlias(sk.get(), "lo", nullptr));
  if (a.isolated) return Status::Ok();

  ASSIGN_OR_RETURN(Link link, GetLink(sk.get(), a.interface_name));
  ASSIGN_OR_RETURN(NlAddr gateway, ParseIpv4(a.gateway, 32));
  ASSIGN_OR_RETURN(NlAddr any, ParseIpv4("0.0.0.0", 0));
  Route route(rtnl_route_alloc());
  rtnl_nexthop* nh = rtnl_route_nh_alloc();
  if (!route || nh == nullptr) {
    if (nh != nullptr) rtnl_route_nh_free(nh);
    return Status::Internal("netlink: allocating a route failed (out of memory)");
  }
  rtnl_route_set_family(route.get(), AF_INET);
  rtnl_route_set_table(route.get(), RT_TABLE_MAIN);
  rtnl_route_set_scope(route.get(), RT_SCOPE_UNIVERSE);
  rtnl_route_set_protocol(route.get(), RTPROT_BOOT);
  rtnl_route_set_type(route.get(), RTN_UNICAST);
  int err = rtnl_route_set_dst(route.get(), any.get());
  if (err < 0) {
    rtnl_route_nh_free(nh);
    return NlError("netlink: building the default route", err);
  }
  rtnl_route_nh_set_gateway(nh, gateway.get());
  rtnl_route_nh_set_ifindex(nh, rtnl_link_get_ifindex(link.get()));
  rtnl_route_add_nexthop(route.get(), nh);  // the route owns nh now
  err = rtnl_route_add(sk.get(), route.get(), NLM_F_CREATE | NLM_F_EXCL);
  if (err < 0) return NlError("netlink: adding the default route via " + a.gateway + " inside the namespace", err);
  return Status::Ok();
}

// The IPv4 addresses of link `ifindex`, or of every link when ifindex is 0.
Result<std::vector<std::string>> AddressesOf(nl_sock* sk, int ifindex) {
  nl_cache* raw = nullptr;
  int err = rtnl_addr_alloc_cache(sk, &raw);
  if (err < 0) return NlError("netlink: listing addresses", err);
  Cache cache(raw);
  std::vector<std::string> out;
  for (nl_object* o = nl_cache_get_first(cache.get()); o != nullptr; o = nl_cache_get_next(o)) {
    auto* a = reinterpret_cast<rtnl_addr*>(o);
    if (rtnl_addr_get_family(a) != AF_INET) continue;
    if (ifindex > 0 && rtnl_addr_get_ifindex(a) != ifindex) continue;
    nl_addr* local = rtnl_addr_get_local(a);
    if (local == nullptr || nl_addr_get_len(local) != sizeof(in_addr)) continue;
    char text[INET_ADDRSTRLEN] = {};
    if (inet_ntop(AF_INET, nl_addr_get_binary_addr(local), text, sizeof(text)) == nullptr) continue;
    out.push_back(std::string(text) + "/" + std::to_string(rtnl_addr_get_prefixlen(a)));
  }
  return out;
}

}  // namespace

Status CreateBridge(const std::string& name, const std::string& address, int prefix_length, const std::string& alias) {
  RETURN_IF_ERROR(CheckName(name));
  if (alias.size() >= 256) {
    return Status::InvalidArgument("bridge alias is " + std::to_string(alias.size()) + " bytes; at most 255");
  }
  ASSIGN_OR_RETURN(Sock sk, Connect());

  // Built by hand: libnl has no setters for the bridge's own attributes. STP off and forward
  // delay 0 make a new port forward at once (a 15 s default delay would stall every job's start).
  Msg msg(nlmsg_alloc_simple(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL));
  if (!msg) return Status::Internal("netlink: allocating a message failed (out of memory)");
  ifinfomsg ifi{};
  ifi.ifi_family = AF_UNSPEC;
  nlattr* info = nullptr;
  nlattr* data = nullptr;
  bool built = nlmsg_append(msg.get(), &ifi, sizeof(ifi), NLMSG_ALIGNTO) == 0 &&
               nla_put_string(msg.get(), IFLA_IFNAME, name.c_str()) == 0 &&
               (info = nla_nest_start(msg.get(), IFLA_LINKINFO)) != nullptr &&
               nla_put_string(msg.get(), IFLA_INFO_KIND, "bridge") == 0 &&
               (data = nla_nest_start(msg.get(), IFLA_INFO_DATA)) != nullptr &&
               nla_put_u32(msg.get(), IFLA_BR_FORWARD_DELAY, 0) == 0 &&
               nla_put_u32(msg.get(), IFLA_BR_STP_STATE, 0) == 0 && nla_nest_end(msg.get(), data) == 0 &&
               nla_nest_end(msg.get(), info) == 0;
  if (!built) return Status::Internal("netlink: building the request for bridge " + name + " failed");
  int err = nl_send_sync(sk.get(), msg.release());  // frees the message
  if (err < 0) return NlError("netlink: creating bridge " + name, err);

  // From here on a failure deletes the bridge again, so that the name (the claim) is released.
  Status st = SetUpAndAlias(sk.get(), name, &alias);
  if (st.ok() && !address.empty()) st = AddAddress(sk.get(), name, address, prefix_length);
  if (!st.ok()) {
    (void)DeleteLinkWith(sk.get(), name);
    return st;
  }
  return Status::Ok();
}

Result<std::string> LinkAlias(const std::string& name) {
  ASSIGN_OR_RETURN(Sock sk, Connect());
  ASSIGN_OR_RETURN(Link link, GetLink(sk.get(), name));
  const char* alias = rtnl_link_get_ifalias(link.get());
  return std::string(alias != nullptr ? alias : "");
}

Status DeleteLink(const std::string& name) {
  RETURN_IF_ERROR(CheckName(name));
  ASSIGN_OR_RETURN(Sock sk, Connect());
  return DeleteLinkWith(sk.get(), name);
}

Result<std::vector<std::string>> ListLinks(const std::string& prefix) {
  ASSIGN_OR_RETURN(Sock sk, Connect());
  nl_cache* raw = nullptr;
  int err = rtnl_link_alloc_cache(sk.get(), AF_UNSPEC, &raw);
  if (err < 0) return NlError("netlink: listing links", err);
  Cache cache(raw);
  std::vector<std::string> names;
  for (nl_object* o = nl_cache_get_first(cache.get()); o != nullptr; o = nl_cache_get_next(o)) {
    const char* n = rtnl_link_get_name(reinterpret_cast<rtnl_link*>(o));
    if (n != nullptr && std::string_view(n).starts_with(prefix)) names.emplace_back(n);
  }
  return names;
}

Result<std::vector<std::string>> LinkAddresses(const std::string& name) {
  ASSIGN_OR_RETURN(Sock sk, Connect());
  ASSIGN_OR_RETURN(Link link, GetLink(sk.get(), name));
  int ifindex = rtnl_link_get_ifindex(link.get());
  return AddressesOf(sk.get(), ifindex);
}

Result<std::vector<std::string>> NodeAddresses() {
  ASSIGN_OR_RETURN(Sock sk, Connect());
  return AddressesOf(sk.get(), 0);
}

Status ConnectNamespace(int netns_fd, const NetworkAttachment& a) {
  RETURN_IF_ERROR(CheckName(a.host_veth));
  RETURN_IF_ERROR(CheckName(a.interface_name));
  RETURN_IF_ERROR(CheckName(a.bridge));
  ASSIGN_OR_RETURN(Sock host, Connect());
  ASSIGN_OR_RETURN(Link bridge, GetLink(host.get(), a.bridge));

  // A link of this name can only be left over from an instance that had this lease before (its
  // namespace is still being torn down by the kernel): leases are unique, so it is deleted and
  // the creation tried once more.
  Status st = CreateVeth(host.get(), a.host_veth, a.interface_name, netns_fd);
  if (st.IsAlreadyExists()) {
    RETURN_IF_ERROR(DeleteLinkWith(host.get(), a.host_veth));
    st = CreateVeth(host.get(), a.host_veth, a.interface_name, netns_fd);
  }
  RETURN_IF_ERROR(st);

  // Every failure from here on deletes the host end (its peer goes with it).
  auto fail = [&](Status s) {
    (void)DeleteLinkWith(host.get(), a.host_veth);
    return s;
  };
  {
    auto veth = GetLink(host.get(), a.host_veth);
    if (!veth.ok()) return fail(veth.status());
    int err =
        rtnl_link_enslave_ifindex(host.get(), rtnl_link_get_ifindex(bridge.get()), rtnl_link_get_ifindex(veth->get()));
    if (err < 0) return fail(NlError("netlink: adding " + a.host_veth + " to bridge " + a.bridge, err));
    st = SetUpAndAlias(host.get(), a.host_veth, nullptr);
    if (!st.ok()) return fail(st);
  }

  int original = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
  if (original < 0) return fail(SysError("netlink: opening /proc/thread-self/ns/net", errno));
  Status inside;
  {
    NetnsGuard guard(original);
    if (setns(netns_fd, CLONE_NEWNET) != 0) {
      inside = SysError("netlink: setns into the instance's network namespace", errno);
    } else {
      guard.Entered();
      inside = ConfigureInside(a);
      Status back = guard.Restore();
      if (!back.ok()) {
        // The thread is stuck in the instance's namespace and the caller must not go on with it.
        // The host end still goes: `host` was opened in the node's namespace and stays there.
        close(original);
        return fail(back.WithPrefix(inside.ok() ? "after configuring the namespace" : inside.message()));
      }
    }
  }
  close(original);
  if (!inside.ok()) return fail(inside);
  return Status::Ok();
}

}  // namespace kiln::runtime::netlink
