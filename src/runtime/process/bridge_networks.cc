#include "runtime/process/bridge_networks.h"

#include <arpa/inet.h>
#include <nftables/libnftables.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "base/fs.h"
#include "base/hash.h"
#include "base/json_parse.h"
#include "base/log.h"
#include "base/mutex.h"
#include "base/thread_annotations.h"
#include "runtime/process/netlink.h"

namespace kiln::runtime {
namespace {

constexpr char kBridgePrefix[] = "kb-";
constexpr size_t kMaxAliasBytes = 255;  // IFALIASZ - 1

struct Ipv4Net {
  uint32_t base = 0;  // host byte order, host bits zero
  int prefix = 0;
};

Result<uint32_t> ParseIpv4(const std::string& text) {
  in_addr a{};
  if (inet_pton(AF_INET, text.c_str(), &a) != 1)
    return Status::InvalidArgument("\"" + text + "\" is not an IPv4 address");
  return ntohl(a.s_addr);
}

std::string Ipv4Text(uint32_t host_order) {
  in_addr a{};
  a.s_addr = htonl(host_order);
  char text[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &a, text, sizeof(text));
  return text;
}

uint32_t Mask(int prefix) { return prefix == 0 ? 0 : ~uint32_t{0} << (32 - prefix); }

// "a.b.c.d/p" with p in 0..32 (host bits must be zero when `strict`).
Result<Ipv4Net> ParseCidr(const std::string& text, bool strict) {
  size_t slash = text.find('/');
  if (slash == std::string::npos) return Status::InvalidArgument("\"" + text + "\" is not a CIDR (a.b.c.d/len)");
  auto addr = ParseIpv4(text.substr(0, slash));
  if (!addr.ok()) return Status::InvalidArgument("\"" + text + "\" is not a CIDR (a.b.c.d/len)");
  std::string len = text.substr(slash + 1);
  if (len.empty() || len.size() > 2 || len.find_first_not_of("0123456789") != std::string::npos) {
    return Status::InvalidArgument("\"" + text + "\" is not a CIDR (a.b.c.d/len)");
  }
  int prefix = std::stoi(len);
  if (prefix > 32) return Status::InvalidArgument("\"" + text + "\": prefix length over 32");
  if (strict && (*addr & ~Mask(prefix)) != 0) {
    return Status::InvalidArgument("\"" + text + "\" has host bits set; the network is " +
                                   Ipv4Text(*addr & Mask(prefix)) + "/" + std::to_string(prefix));
  }
  return Ipv4Net{*addr & Mask(prefix), prefix};
}

bool ValidNetworkName(const std::string& name) {
  if (name.empty() || name.size() > 128) return false;
  for (char c : name) {
    bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return name != "." && name != "..";
}

// CAP_NET_ADMIN (bit 12) in the calling thread's effective set.
bool HasNetAdmin() {
  std::ifstream in("/proc/thread-self/status");  // capabilities are per thread
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("CapEff:", 0) != 0) continue;
    uint64_t caps = std::strtoull(line.c_str() + 7, nullptr, 16);
    return (caps >> 12) & 1;
  }
  return false;
}

std::string TableName(const std::string& state_dir) { return "kiln_" + Sha256Hex(state_dir).substr(0, 8); }

struct Network {
  std::string name;
  int64_t index = 0;
  bool isolated = false;
  std::map<std::string, int64_t> leases;  // instance id -> host number within the subnet (.2 = 2)
  // Where the next lease search starts (in memory only): addresses rotate instead of the lowest
  // free one being reused at once, so a new instance does not inherit the host's neighbour entry
  // of the one that just stopped (its first SYN was lost to the old MAC: a 1-s retransmission
  // on every serverless cold start).
  int64_t next_host = 2;
};

class NftContext {
 public:
  NftContext() : ctx_(nft_ctx_new(NFT_CTX_DEFAULT)) {
    if (ctx_ != nullptr) {
      nft_ctx_buffer_output(ctx_);
      nft_ctx_buffer_error(ctx_);
    }
  }
  ~NftContext() {
    if (ctx_ != nullptr) nft_ctx_free(ctx_);
  }
  NftContext(const NftContext&) = delete;
  NftContext& operator=(const NftContext&) = delete;

  // Runs `commands` as one transaction (nft -f): all of it applies or none.
  Status Run(const std::string& commands) {
    if (ctx_ == nullptr) return Status::Internal("nftables: creating a context failed");
    if (nft_run_cmd_from_buffer(ctx_, commands.c_str()) != 0) {
      std::string err = nft_ctx_get_error_buffer(ctx_);
      while (!err.empty() && err.back() == '\n') err.pop_back();
      return Status::Internal("nftables: " + err);
    }
    return Status::Ok();
  }

 private:
  nft_ctx* ctx_;
};

class BridgeNetworks final : public InstanceNetworks {
 public:
  BridgeNetworks(BridgeNetworksOptions options, Ipv4Net range, std::map<std::string, Network> networks)
      : options_(std::move(options)),
        range_(range),
        table_(TableName(options_.state_dir)),
        count_(int64_t{1} << (options_.subnet_prefix - range.prefix)),
        networks_(std::move(networks)) {}

  Status Init() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return WriteRules();
  }

  Result<NetworkInfo> Ensure(const std::string& name, bool isolated) override EXCLUDES(mu_) {
    if (!ValidNetworkName(name)) {
      return Status::InvalidArgument("network name \"" + name + "\" is not valid: [A-Za-z0-9._-]{1,128}");
    }
    MutexLock lock(mu_);
    auto it = networks_.find(name);
    if (it != networks_.end()) {
      Network& n = it->second;
      if (n.isolated != isolated) {
        return Status::FailedPrecondition("network " + name + " exists with network isolation " +
                                          (n.isolated ? "on" : "off") + "; Remove it before ensuring it " +
                                          (isolated ? "isolated" : "not isolated"));
      }
      // The bridge may be gone (deleted by hand, the node rebooted): make it again, on the same
      // subnet when that is still free, else on a new one (its old leases are void then).
      auto alias = netlink::LinkAlias(BridgeName(n.index));
      if (alias.ok() && *alias == Alias(name)) return Info(n);
      if (!alias.ok() && !alias.status().IsNotFound()) return alias.status();
      bool recreated = false;
      if (!alias.ok()) {
        Status st = netlink::CreateBridge(BridgeName(n.index), Gateway(n.index), options_.subnet_prefix, Alias(name));
        if (!st.ok() && !st.IsAlreadyExists()) return st;
        recreated = st.ok();
      }
      if (!recreated) {  // another server holds the index now
        n.leases.clear();
        n.next_host = 2;
        ASSIGN_OR_RETURN(n.index, Claim(name, n.index));
      }
      RETURN_IF_ERROR(Save(n));
      RETURN_IF_ERROR(WriteRules());
      return Info(n);
    }

    Network n;
    n.name = name;
    n.isolated = isolated;
    ASSIGN_OR_RETURN(n.index, Claim(name, -1));
    Status st = Save(n);
    if (st.ok()) {
      networks_[name] = n;
      st = WriteRules();
      if (!st.ok()) {
        networks_.erase(name);
        (void)::unlink(StatePath(name).c_str());
      }
    }
    if (!st.ok()) {
      (void)netlink::DeleteLink(BridgeName(n.index));
      return st;
    }
    KLOG(info, "network created",
         ({{"network", name},
           {"bridge", BridgeName(n.index)},
           {"subnet", Subnet(n.index)},
           {"isolated", isolated ? "true" : "false"}}));
    return Info(n);
  }

  Result<NetworkAttachment> Attach(const std::string& name, const std::string& instance_id,
                                   const std::vector<int>& loopback_forwards) override EXCLUDES(mu_) {
    MutexLock lock(mu_);
    auto it = networks_.find(name);
    if (it == networks_.end()) return Status::NotFound("network " + name + " does not exist");
    Network& n = it->second;
    auto lease = n.leases.find(instance_id);
    if (lease != n.leases.end()) return Attachment(n, lease->second, loopback_forwards);

    std::set<int64_t> taken;
    for (const auto& [id, host] : n.leases) taken.insert(host);
    int64_t last = SubnetSize() - 2;  // the top address is the broadcast
    int64_t host = 0;
    const int64_t span = last - 1;  // hosts 2..last
    const int64_t start = n.next_host >= 2 && n.next_host <= last ? n.next_host : 2;
    for (int64_t i = 0; i < span; ++i) {
      const int64_t candidate = 2 + (start - 2 + i) % span;
      if (taken.count(candidate) == 0) {
        host = candidate;
        break;
      }
    }
    if (host == 0) {
      return Status::ResourceExhausted("network " + name + " is full: its /" + std::to_string(options_.subnet_prefix) +
                                       " holds " + std::to_string(last - 1) +
                                       " instances; lower network.subnet_prefix for larger networks");
    }
    n.leases[instance_id] = host;
    Status st = Save(n);
    if (!st.ok()) {
      n.leases.erase(instance_id);
      return st;
    }
    n.next_host = host + 1;
    return Attachment(n, host, loopback_forwards);
  }

  Status Detach(const std::string& name, const std::string& instance_id) override EXCLUDES(mu_) {
    MutexLock lock(mu_);
    auto it = networks_.find(name);
    if (it == networks_.end()) return Status::Ok();
    Network& n = it->second;
    auto lease = n.leases.find(instance_id);
    if (lease == n.leases.end()) return Status::Ok();
    // The veth normally went with the instance's namespace; this catches a namespace that
    // outlived the instance, so the address is really free for the next holder.
    RETURN_IF_ERROR(netlink::DeleteLink(VethName(n.index, lease->second)));
    int64_t host = lease->second;
    n.leases.erase(lease);
    Status st = Save(n);
    if (!st.ok()) n.leases[instance_id] = host;
    return st;
  }

  // The kernel takes ~100 ms to delete a bridge: the links go after the lock is released, so
  // that the next job's Ensure (often right behind this job's end) does not wait for them. Until
  // then the bridge still holds its index (Claim skips it), and a crash in between leaves a
  // bridge of this state_dir that no network holds, which Sweep deletes.
  Status Remove(const std::string& name) override EXCLUDES(mu_) {
    std::vector<std::string> links;
    {
      MutexLock lock(mu_);
      RETURN_IF_ERROR(ForgetLocked(name, &links));
      RETURN_IF_ERROR(WriteRules());
    }
    return DeleteLinks(links);
  }

  Result<std::set<std::string>> Sweep(const std::set<std::string>& live_instance_ids) override EXCLUDES(mu_) {
    MutexLock lock(mu_);
    std::set<std::string> removed;
    std::vector<std::string> names;
    for (const auto& [name, n] : networks_) names.push_back(name);
    for (const std::string& name : names) {
      Network& n = networks_.at(name);
      std::map<std::string, int64_t> live;
      for (const auto& [id, host] : n.leases) {
        if (live_instance_ids.count(id) != 0) live[id] = host;
      }
      if (live.empty()) {
        RETURN_IF_ERROR(RemoveLocked(name));
        removed.insert(name);
      } else if (live.size() != n.leases.size()) {
        for (const auto& [id, host] : n.leases) {
          if (live.count(id) == 0) (void)netlink::DeleteLink(VethName(n.index, host));
        }
        n.leases = std::move(live);
        RETURN_IF_ERROR(Save(n));
      }
    }

    // Orphaned Kiln bridges: this server's that no network holds (it died between creating a
    // bridge and recording it), and any whose owner's state_dir is gone, with that owner's table.
    ASSIGN_OR_RETURN(std::vector<std::string> bridges, netlink::ListLinks(kBridgePrefix));
    std::set<int64_t> ours;
    for (const auto& [name, n] : networks_) ours.insert(n.index);
    for (const std::string& bridge : bridges) {
      auto alias = netlink::LinkAlias(bridge);
      if (!alias.ok() || alias->rfind("kiln ", 0) != 0) continue;
      size_t last_space = alias->rfind(' ');
      if (last_space <= 5) continue;
      std::string dir = alias->substr(5, last_space - 5);
      bool orphan = false;
      if (dir == options_.state_dir) {
        std::string digits = bridge.substr(std::string(kBridgePrefix).size());
        orphan = digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 9 ||
                 ours.count(std::stoll(digits)) == 0;
      } else {
        orphan = !dir.empty() && dir[0] == '/' && !PathExists(dir);
      }
      if (!orphan) continue;
      KLOG(info, "deleting orphaned bridge", ({{"bridge", bridge}, {"alias", *alias}}));
      RETURN_IF_ERROR(netlink::DeleteLink(bridge));
      if (dir != options_.state_dir && options_.firewall) {
        std::string t = TableName(dir);
        (void)nft_.Run("table inet " + t + "\ndelete table inet " + t + "\n");
      }
    }
    RETURN_IF_ERROR(WriteRules());
    return removed;
  }

 private:
  static std::string BridgeName(int64_t index) { return kBridgePrefix + std::to_string(index); }
  static std::string VethName(int64_t index, int64_t host) {
    return "kv" + std::to_string(index) + "-" + std::to_string(host);
  }
  int64_t SubnetSize() const { return int64_t{1} << (32 - options_.subnet_prefix); }
  uint32_t SubnetBase(int64_t index) const { return range_.base + static_cast<uint32_t>(index * SubnetSize()); }
  std::string Subnet(int64_t index) const {
    return Ipv4Text(SubnetBase(index)) + "/" + std::to_string(options_.subnet_prefix);
  }
  std::string Gateway(int64_t index) const { return Ipv4Text(SubnetBase(index) + 1); }
  std::string StatePath(const std::string& name) const { return options_.state_dir + "/" + name + ".json"; }
  // "kiln <state_dir> <name>", the name cut to fit IFALIASZ (Sweep reads only the state_dir and
  // the bridge's index; the name is for people running `ip -d link`).
  std::string Alias(const std::string& name) const {
    std::string alias = "kiln " + options_.state_dir + " " + name;
    if (alias.size() > kMaxAliasBytes) alias.resize(kMaxAliasBytes);
    return alias;
  }

  NetworkInfo Info(const Network& n) const {
    NetworkInfo info;
    info.name = n.name;
    info.bridge = BridgeName(n.index);
    info.subnet = Subnet(n.index);
    info.gateway = Gateway(n.index);
    info.prefix_length = options_.subnet_prefix;
    info.isolated = n.isolated;
    return info;
  }

  NetworkAttachment Attachment(const Network& n, int64_t host, const std::vector<int>& forwards) const {
    NetworkAttachment a;
    a.network = n.name;
    a.bridge = BridgeName(n.index);
    a.host_veth = VethName(n.index, host);
    a.address = Ipv4Text(SubnetBase(n.index) + static_cast<uint32_t>(host));
    a.prefix_length = options_.subnet_prefix;
    a.gateway = Gateway(n.index);
    a.isolated = n.isolated;
    a.interface_name = "eth0";
    if (!n.isolated) a.loopback_forwards = forwards;
    return a;
  }

  // Claims a subnet index for network `name` by creating its bridge: the lowest index ≥ 1 that
  // none of this server's networks holds, whose subnet no address of the node lies in, and whose
  // bridge name is free (AlreadyExists: another server took it; try the next). `except` is an
  // index not to retry.
  Result<int64_t> Claim(const std::string& name, int64_t except) REQUIRES(mu_) {
    ASSIGN_OR_RETURN(std::vector<std::string> node_addresses, netlink::NodeAddresses());
    std::vector<uint32_t> used;
    for (const std::string& a : node_addresses) {
      auto addr = ParseIpv4(a.substr(0, a.find('/')));
      if (addr.ok()) used.push_back(*addr);
    }
    std::set<int64_t> ours;
    for (const auto& [other, n] : networks_) {
      if (other != name) ours.insert(n.index);
    }
    uint32_t mask = Mask(options_.subnet_prefix);
    for (int64_t k = 1; k < count_; ++k) {
      if (k == except || ours.count(k) != 0) continue;
      bool in_use = false;
      for (uint32_t a : used) in_use = in_use || (a & mask) == SubnetBase(k);
      if (in_use) continue;
      Status st = netlink::CreateBridge(BridgeName(k), Gateway(k), options_.subnet_prefix, Alias(name));
      if (st.IsAlreadyExists()) continue;
      RETURN_IF_ERROR(st);
      return k;
    }
    return Status::ResourceExhausted("no free subnet for network " + name + ": every /" +
                                     std::to_string(options_.subnet_prefix) + " of network.cidr " + options_.cidr +
                                     " (" + std::to_string(count_ - 1) +
                                     " usable) is in use on this node; widen network.cidr or raise "
                                     "network.subnet_prefix");
  }

  Status Save(const Network& n) REQUIRES(mu_) {
    nlohmann::json leases = nlohmann::json::object();
    for (const auto& [id, host] : n.leases) leases[id] = host;
    nlohmann::json doc = {{"name", n.name}, {"index", n.index}, {"isolated", n.isolated}, {"leases", leases}};
    Status st = ReplaceFile(StatePath(n.name), doc.dump(2) + "\n");
    if (!st.ok()) return st.WithPrefix("saving network " + n.name);
    return Status::Ok();
  }

  Status RemoveLocked(const std::string& name) REQUIRES(mu_) {
    std::vector<std::string> links;
    RETURN_IF_ERROR(ForgetLocked(name, &links));
    return DeleteLinks(links);
  }

  // Forgets network `name` (its state file and entry) and appends the links to delete to
  // `links`: its leases' host veths (one whose namespace outlived its instance), then its bridge
  // when it is still ours (if it vanished and another server took the name, that one is theirs).
  Status ForgetLocked(const std::string& name, std::vector<std::string>* links) REQUIRES(mu_) {
    auto it = networks_.find(name);
    if (it == networks_.end()) return Status::Ok();
    const Network& n = it->second;
    auto alias = netlink::LinkAlias(BridgeName(n.index));
    if (!alias.ok() && !alias.status().IsNotFound()) return alias.status();
    if (::unlink(StatePath(name).c_str()) != 0 && errno != ENOENT) {
      return ErrnoStatus("removing " + StatePath(name), errno);
    }
    for (const auto& [id, host] : n.leases) links->push_back(VethName(n.index, host));
    if (alias.ok() && alias->rfind("kiln " + options_.state_dir + " ", 0) == 0) links->push_back(BridgeName(n.index));
    KLOG(info, "network removed", ({{"network", name}, {"bridge", BridgeName(n.index)}}));
    networks_.erase(it);
    return Status::Ok();
  }

  // Deletes `links` in order; absent ones are fine (netlink::DeleteLink), the first other error
  // is returned after trying them all.
  static Status DeleteLinks(const std::vector<std::string>& links) {
    Status first;
    for (const std::string& link : links) {
      Status st = netlink::DeleteLink(link);
      if (!st.ok() && first.ok()) first = st;
    }
    return first;
  }

  // The whole table, replaced in one transaction (the leading `table` makes the `delete` valid
  // when the table does not exist yet); with no networks the table is only deleted.
  std::string Ruleset() const REQUIRES(mu_) {
    std::string t = "table inet " + table_ + "\ndelete table inet " + table_ + "\n";
    if (networks_.empty()) return t;
    std::string forward, input, nat;
    for (const auto& [name, n] : networks_) {
      std::string br = "\"" + BridgeName(n.index) + "\"";
      if (n.isolated) {
        // Anything routed in or out; a job's own hosts talk over the bridge (bridged, or seen
        // here with both names the bridge when br_netfilter is loaded).
        forward += "    iifname " + br + " oifname != " + br + " drop\n";
        forward += "    oifname " + br + " iifname != " + br + " drop\n";
        input += "    iifname " + br + " ct state established,related accept\n";
        input += "    iifname " + br + " drop\n";
      } else {
        forward += "    iifname " + br + " oifname \"kb-*\" oifname != " + br + " drop\n";
        forward += "    oifname " + br + " iifname \"kb-*\" iifname != " + br + " drop\n";
        nat += "    ip saddr " + Subnet(n.index) + " oifname != \"kb-*\" masquerade\n";
      }
    }
    t += "table inet " + table_ + " {\n";
    t += "  chain forward {\n    type filter hook forward priority filter; policy accept;\n" + forward + "  }\n";
    t += "  chain input {\n    type filter hook input priority filter; policy accept;\n" + input + "  }\n";
    t += "  chain postrouting {\n    type nat hook postrouting priority srcnat; policy accept;\n" + nat + "  }\n";
    t += "}\n";
    return t;
  }

  Status WriteRules() REQUIRES(mu_) {
    if (!options_.firewall) return Status::Ok();
    Status st = nft_.Run(Ruleset());
    if (!st.ok()) return st.WithPrefix("writing nftables table inet " + table_);
    return Status::Ok();
  }

  const BridgeNetworksOptions options_;
  const Ipv4Net range_;
  const std::string table_;
  const int64_t count_;  // blocks in the range, index 0 (never used) included

  Mutex mu_;
  std::map<std::string, Network> networks_ GUARDED_BY(mu_);
  NftContext nft_ GUARDED_BY(mu_);
};

Result<std::map<std::string, Network>> LoadState(const std::string& dir) {
  std::map<std::string, Network> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    std::string file = entry.path().filename().string();
    if (file.size() <= 5 || file.substr(file.size() - 5) != ".json") continue;
    auto text = ReadFile(entry.path().string());
    auto doc = text.ok() ? ParseJsonBounded(*text) : Result<nlohmann::json>(text.status());
    Network n;
    bool valid = doc.ok() && doc->is_object() && doc->value("name", "") + ".json" == file && doc->contains("index") &&
                 (*doc)["index"].is_number_integer();
    if (valid) {
      n.name = (*doc)["name"];
      n.index = (*doc)["index"];
      n.isolated = doc->value("isolated", false);
      if (doc->contains("leases") && (*doc)["leases"].is_object()) {
        for (const auto& [id, host] : (*doc)["leases"].items()) {
          if (host.is_number_integer()) n.leases[id] = host.get<int64_t>();
        }
      }
      valid = ValidNetworkName(n.name) && n.index > 0;
    }
    if (!valid) {
      KLOG(warn, "ignoring unreadable network state", ({{"file", entry.path().string()}}));
      continue;
    }
    out[n.name] = std::move(n);
  }
  if (ec) return ErrnoStatus("listing " + dir, ec.value());
  return out;
}

// Creates and deletes a bridge: the one real test that this process may change the node's links.
Status Probe() {
  static std::atomic<int> counter{0};
  std::string name = "kbp" + std::to_string(getpid() % 10000000) + "-" + std::to_string(counter++ % 100);
  Status st = netlink::CreateBridge(name, "", 0, "kiln probe");
  if (!st.ok()) return st;
  return netlink::DeleteLink(name);
}

}  // namespace

Result<std::unique_ptr<InstanceNetworks>> OpenBridgeNetworks(BridgeNetworksOptions options) {
  auto range = ParseCidr(options.cidr, /*strict=*/true);
  if (!range.ok()) return Status::FailedPrecondition("network.cidr: " + range.status().message());
  if (options.subnet_prefix < 16 || options.subnet_prefix > 28 || options.subnet_prefix < range->prefix) {
    return Status::FailedPrecondition("network.subnet_prefix " + std::to_string(options.subnet_prefix) +
                                      " must be in 16..28 and at least network.cidr's prefix length (" +
                                      std::to_string(range->prefix) + ")");
  }
  if (options.subnet_prefix == range->prefix) {
    return Status::FailedPrecondition("network.cidr " + options.cidr + " holds a single /" +
                                      std::to_string(options.subnet_prefix) +
                                      " and the first block is never used; widen network.cidr or raise "
                                      "network.subnet_prefix");
  }
  if (options.subnet_prefix - range->prefix > 20) {
    return Status::FailedPrecondition("network.cidr " + options.cidr + " in /" + std::to_string(options.subnet_prefix) +
                                      " blocks makes over a million networks; raise network.subnet_prefix's "
                                      "distance to at most 20 bits");
  }
  if (!HasNetAdmin()) {
    return Status::FailedPrecondition(
        "per-instance networks need CAP_NET_ADMIN (run the server as root), or set network.mode: host");
  }
  Status probe = Probe();
  if (!probe.ok()) {
    return Status::FailedPrecondition("cannot create bridges on this node (" + probe.message() +
                                      "); run the server as root with the bridge module available, or set "
                                      "network.mode: host");
  }

  if (options.state_dir.empty()) return Status::InvalidArgument("BridgeNetworksOptions.state_dir is empty");
  RETURN_IF_ERROR(MakeDirs(options.state_dir, 0700));
  std::error_code ec;
  auto canonical = std::filesystem::weakly_canonical(options.state_dir, ec);
  if (!ec) options.state_dir = canonical.string();
  while (options.state_dir.size() > 1 && options.state_dir.back() == '/') options.state_dir.pop_back();
  // The alias ("kiln <state_dir> <name>", ≤ 255 bytes) must hold the whole state_dir, which is
  // how Sweep tells whose a bridge is.
  if (options.state_dir.size() > 200 || options.state_dir.find_first_of("\n") != std::string::npos) {
    return Status::FailedPrecondition("the networks' state directory " + options.state_dir +
                                      " is over 200 bytes; use a shorter data_dir");
  }
  ASSIGN_OR_RETURN(auto networks, LoadState(options.state_dir));
  if (!options.firewall) {
    KLOG(warn,
         "network.firewall is off: no nftables rules; jobs are kept apart only while the node does not forward "
         "IPv4 (net.ipv4.ip_forward=0), and isolated instances can reach the node",
         ({{"state_dir", options.state_dir}}));
  }
  bool firewall = options.firewall;
  auto impl = std::make_unique<BridgeNetworks>(std::move(options), *range, std::move(networks));
  Status st = impl->Init();
  if (!st.ok()) {
    if (firewall) {
      return Status::FailedPrecondition(st.message() +
                                        "; the node needs nf_tables (nftables) for Kiln's network rules, or set "
                                        "network.firewall: false");
    }
    return st;
  }
  return std::unique_ptr<InstanceNetworks>(std::move(impl));
}

}  // namespace kiln::runtime
