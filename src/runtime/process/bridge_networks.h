#pragma once
// BridgeNetworks: InstanceNetworks (runtime/networks.h) on Linux bridges, for the process runtime.
//
//   bridge      "kb-<subnet index>", e.g. kb-12 holding 10.213.12.1/24 (the gateway), ifalias
//               "kiln <state_dir> <network name>". Several servers may share a node (tests do):
//               a subnet index is claimed by creating its bridge (the kernel's names are the
//               node-wide lock), and an index whose bridge exists or whose subnet any link of
//               the node uses is skipped.
//   host veth   "kv<subnet index>-<last octet>", e.g. kv12-2 for 10.213.12.2 (unique per lease)
//   rules       one nftables table per server, `inet kiln_<8 hex of hash(state_dir)>`
//               (libnftables), rewritten whole on every change:
//               forward: drop between a Kiln bridge and any other Kiln bridge; drop anything
//                        forwarded from or to an isolated bridge;
//               input:   drop new connections from an isolated bridge;
//               postrouting (nat): masquerade non-isolated subnets leaving through a non-Kiln
//                        interface.
//               Nothing outside the server's table is touched, and it is deleted with the last
//               network.
//   state       <state_dir>/<name>.json per network: {name, index, isolated, leases:{id: octet}},
//               written by rename. Sweep removes this server's networks whose instances are
//               gone, and Kiln bridges whose alias names a state_dir that no longer exists (a
//               server whose data dir was deleted); it never touches another live server's.
//
// Subnets are the /subnet_prefix blocks of `cidr` (default 10.213.0.0/16 in /24s: 256 networks
// of 253 instances), the first block skipped; the operator chooses a range unused on the node.

#include <memory>
#include <string>

#include "base/status.h"
#include "runtime/networks.h"

namespace kiln::runtime {

struct BridgeNetworksOptions {
  std::string state_dir;               // created if missing
  std::string cidr = "10.213.0.0/16";  // the private range networks are carved from
  int subnet_prefix = 24;              // each network's block, 16..28 and ≥ cidr's prefix
  // When false no nftables rules are written (a node without nf_tables): networks still work,
  // but jobs are kept apart only while the node does not forward IPv4 (net.ipv4.ip_forward=0),
  // isolated instances can reach the node, and nothing is masqueraded. Logged once.
  bool firewall = true;
};

// Checks that the process may change the node's links (CAP_NET_ADMIN: root), that the range is
// valid, and loads the state. FailedPrecondition with what to change when networks cannot work
// here (the server then keeps instances on the node's network and says so).
Result<std::unique_ptr<InstanceNetworks>> OpenBridgeNetworks(BridgeNetworksOptions options);

}  // namespace kiln::runtime
