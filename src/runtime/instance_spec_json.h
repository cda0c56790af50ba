#pragma once
// InstanceSpec as JSON: the process runtime's on-disk spec (process/state.h, read by the shim) and
// the Slurm node protocol's GET .../spec (slurm/spec_json.h) use this one form, so a member added
// to InstanceSpec is added here once.
//
// Compatibility: the decoder accepts documents without any optional member (written by an older
// Kiln) and ignores members it does not know (a newer one's); the encoder writes every member.
//
// Thread-safety: all functions are thread-safe (no shared state).

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "runtime/runtime.h"

namespace kiln::runtime {

// Every InstanceSpec member, including container (with entrypoint), network and the
// group/shape/placement members. Required when decoding: instance_id and argv.
nlohmann::json SpecToJson(const InstanceSpec& spec);
// InvalidArgument("bad instance spec: <what>") for a document that is not an object, lacks a
// required member or has a member of the wrong type.
Result<InstanceSpec> SpecFromJson(const nlohmann::json& j);
// The text forms of the two above (parse errors are InvalidArgument too).
std::string EncodeSpec(const InstanceSpec& spec);
Result<InstanceSpec> DecodeSpec(std::string_view text);

}  // namespace kiln::runtime
