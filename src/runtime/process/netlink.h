#pragma once
// Link, address and route changes over rtnetlink (libnl-route-3), for the bridges of
// BridgeNetworks and the veth of each namespaced instance (NetworkAttachment). Needs
// CAP_NET_ADMIN in the node's network namespace; every call is a few netlink round trips, no
// subprocess.
//
// Thread-safety: the functions may be called from any thread. ConnectNamespace switches the
// calling thread's network namespace (setns) and switches it back before returning, so call it
// from a thread that nothing else uses meanwhile (the shim is single-threaded).

#include <string>
#include <vector>

#include "base/status.h"
#include "runtime/runtime.h"

namespace kiln::runtime::netlink {

// Creates bridge `name` (≤ 15 bytes) with `address`/`prefix_length` on it (none when `address`
// is empty) and `alias` (< 256 bytes) as its ifalias (who owns it: BridgeNetworks writes
// "kiln <state_dir> <network name>"), with STP off and forward delay 0 (ports forward at once),
// and brings it up. AlreadyExists when a link of that name exists: the kernel's link names are
// the node-wide lock through which several Kiln servers on one node claim subnets. When a later
// step fails the bridge is deleted again.
Status CreateBridge(const std::string& name, const std::string& address, int prefix_length, const std::string& alias);

// The ifalias of link `name` ("" when it has none). NotFound if absent.
Result<std::string> LinkAlias(const std::string& name);

// Deletes link `name` (a bridge, a veth's host end: its peer goes with it). Ok when absent.
Status DeleteLink(const std::string& name);

// Names of the links in the calling thread's namespace that start with `prefix`.
Result<std::vector<std::string>> ListLinks(const std::string& prefix);

// The IPv4 addresses (with prefix length, "10.213.12.1/24") of link `name`. NotFound if absent.
Result<std::vector<std::string>> LinkAddresses(const std::string& name);

// Every IPv4 address of every link of the calling thread's namespace ("10.0.0.5/24").
Result<std::vector<std::string>> NodeAddresses();

// Joins the network namespace `netns_fd` (an open /proc/<pid>/ns/net, or a namespace the caller
// created) to attachment.bridge: creates the veth pair attachment.host_veth <-> a peer named
// attachment.interface_name created directly inside the namespace (so it never takes a name in
// the node's namespace), enslaves the host end to the bridge and brings it up; then, inside the
// namespace (setns of the calling thread), gives the peer attachment.address/prefix_length,
// brings it and `lo` up, and adds the default route via attachment.gateway unless
// attachment.isolated. A leftover link named host_veth (from an earlier holder of the lease
// whose namespace the kernel is still tearing down) is deleted and the creation retried once.
// The calling thread is back in its own namespace on return, also on errors. On failure nothing
// is left in the node's namespace (the host end is deleted). The error message says which step
// failed and why.
Status ConnectNamespace(int netns_fd, const NetworkAttachment& attachment);

}  // namespace kiln::runtime::netlink
