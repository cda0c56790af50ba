#pragma once
// InstanceNetworks: the per-job and per-endpoint networks of DESIGN.md §6 (training-contract.md
// §12.1). A network is a host bridge with a subnet of the operator's private range; each instance
// on it gets an address (a lease) and, when launched with that NetworkAttachment, a network
// namespace of its own whose veth joins the bridge. Networks are the node's business, so they live
// beside the runtime; the process runtime's implementation is runtime/process/bridge_networks.h.
//
//   - Jobs cannot reach each other: traffic between two Kiln bridges is dropped.
//   - An isolated network (EnableNetworkIsolation) has no route out: its instances get no default
//     route and the node refuses connections they open (the node may still connect to them: the
//     router reaches an isolated endpoint). Hosts of one job still reach each other.
//   - A non-isolated network's instances reach the node through the gateway (the bridge's
//     address) and beyond it through masquerading when the node forwards IPv4 (Kiln never turns
//     net.ipv4.ip_forward on itself: the node's own networking is untouched).
//   - Kiln's endpoint is reachable from every non-isolated instance at 127.0.0.1:<its port>
//     (NetworkAttachment::loopback_forwards, carried by the instance's shim).
//
// State (leases, subnets) is kept on disk, so a restarted server finds its networks again; a
// namespace and its veth vanish with the instance's last process, and Sweep removes bridges
// whose instances are all gone (after a crash of the server).
//
// Thread-safety: every method may be called from any thread.

#include <set>
#include <string>

#include "base/status.h"
#include "runtime/runtime.h"

namespace kiln::runtime {

struct NetworkInfo {
  std::string name;     // as given to Ensure
  std::string bridge;   // e.g. "kb-12"
  std::string subnet;   // e.g. "10.213.12.0/24"
  std::string gateway;  // the bridge's address, e.g. "10.213.12.1"
  int prefix_length = 24;
  bool isolated = false;
};

class InstanceNetworks {
 public:
  virtual ~InstanceNetworks() = default;

  // Creates network `name` ([A-Za-z0-9._-]{1,128}) unless it exists: a bridge holding the next
  // free subnet of the range, and its rules. Idempotent; an existing network keeps its subnet.
  // FailedPrecondition when it exists with the other `isolated` setting; ResourceExhausted when
  // the range has no free subnet (the message names the setting to widen).
  virtual Result<NetworkInfo> Ensure(const std::string& name, bool isolated) = 0;

  // Leases an address on network `name` for `instance_id` and returns the attachment to put in
  // InstanceSpec::network. The same instance id gets the same address again (idempotent); new
  // ids get the next free address in rotation (.2 upwards; the bridge implementation starts each
  // search after its last lease, so a just-released address is not reused at once), so a fresh
  // network's algo-1..N attached in order get .2...N+1. `loopback_forwards` is copied into the
  // attachment (ignored when isolated).
  // NotFound if the network does not exist; ResourceExhausted when its subnet is full.
  virtual Result<NetworkAttachment> Attach(const std::string& name, const std::string& instance_id,
                                           const std::vector<int>& loopback_forwards) = 0;

  // Releases the lease of `instance_id` (after the instance ended). Ok when there is none.
  virtual Status Detach(const std::string& name, const std::string& instance_id) = 0;

  // Deletes the network: bridge, rules, leases. Ok when it does not exist. Instances still on it
  // lose their connection (call after they ended).
  virtual Status Remove(const std::string& name) = 0;

  // After a restart: removes every network none of whose leases belongs to an instance id in
  // `live_instance_ids` (running instances), drops the other dead leases, deletes orphaned Kiln
  // bridges (see the implementation for which), and rewrites the rules. Returns the names removed.
  virtual Result<std::set<std::string>> Sweep(const std::set<std::string>& live_instance_ids) = 0;
};

}  // namespace kiln::runtime
