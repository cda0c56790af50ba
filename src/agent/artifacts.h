#pragma once
// Job outputs and code (training-contract.md §7.1, §8): model.tar.gz / output.tar.gz, the
// source directory, and the failure file.
//
// Archives are gzip-compressed POSIX (pax) tar files written with libarchive to a temporary file
// next to the host directories (on the job's volume) and uploaded from that file; they are never
// held in memory. Member paths are relative to the archived directory ("model.pth",
// "sub/x.bin"); subdirectories get directory entries; symlinks are stored as symlinks (not
// followed); other special files are skipped. Entries are in sorted path order.
//
// Multi-host merge: the directories are merged into one archive; when several hosts have the
// same relative file path the lowest-numbered host's (first in the list) wins and the clash is
// reported (Uploaded::clashes) and logged.
//
// Functions are thread-safe (no shared state).

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/transfer.h"
#include "agent/unpack_cap.h"
#include "base/status.h"
#include "objects/object_store.h"

namespace kiln::agent {

struct Uploaded {
  // ModelArtifacts.S3ModelArtifacts: ".../<job>/output/model.tar.gz", or with CompressionType NONE
  // the prefix ".../<job>/output/model/" under which the files were uploaded.
  std::string model_artifacts;
  // ".../<job>/output/output.tar.gz" when some host wrote output data; empty otherwise.
  std::string output_data;
  // "<relative path> (algo-<n>)" for every file that lost a multi-host clash.
  std::vector<std::string> clashes;
  uint64_t files = 0;
  uint64_t bytes = 0;  // bytes uploaded (archive sizes, or file sizes for NONE)
};

// "<S3OutputPath>/<job>/output/" with exactly one '/' between S3OutputPath and the job name.
std::string JobOutputPrefix(const nlohmann::json& output_data_config, const std::string& job_name);
// ModelArtifacts.S3ModelArtifacts as it will be after upload (known from creation, §8).
std::string ModelArtifactsUri(const nlohmann::json& output_data_config, const std::string& job_name);

// Archives the union of `model_dirs` (host paths of /opt/ml/model, one per host, lowest host
// first; a missing directory counts as empty) to <prefix>model.tar.gz. Always uploads, also when
// every directory is empty. OutputDataConfig.CompressionType "NONE": uploads each file to
// <prefix>model/<rel> instead (nothing is uploaded when empty). Errors: "ClientError: ..." for a
// bad S3OutputPath or missing bucket; file-system / store errors.
Result<Uploaded> UploadModelArtifacts(objects::ObjectStore& store, const std::vector<std::string>& model_dirs,
                                      const nlohmann::json& output_data_config, const std::string& job_name);

// Archives the union of `output_data_dirs` (host paths of /opt/ml/output/data) to
// <prefix>output.tar.gz when at least one of them holds a file; returns its URI, or "" when there
// was nothing to upload.
Result<std::string> UploadOutputData(objects::ObjectStore& store, const std::vector<std::string>& output_data_dirs,
                                     const nlohmann::json& output_data_config, const std::string& job_name);

// Both of the above for the hosts' /opt/ml directories (lowest host first).
Result<Uploaded> UploadJobArtifacts(objects::ObjectStore& store, const std::vector<std::string>& opt_ml_dirs,
                                    const nlohmann::json& output_data_config, const std::string& job_name);

// Writes the merged archive of `dirs` to `archive_path` (gzip tar as above). Returns the clashes;
// `files` (may be null) receives the number of regular files archived. Exposed for tests.
Result<std::vector<std::string>> WriteTarGz(const std::vector<std::string>& dirs, const std::string& archive_path,
                                            uint64_t* files);

// Fills `code_dir` from `uri` (the value of sagemaker_submit_directory; a JSON-encoded string
// such as "\"s3://b/k\"" is decoded first):
//   s3://bucket/key        a gzip tar (sourcedir.tar.gz), streamed from the store and extracted
//   file:///abs/dir        a directory, copied recursively
//   file:///abs/x.tar.gz   a local gzip tar, extracted
// Extraction keeps every member inside code_dir: leading '/'s of member names are dropped (as
// GNU tar and Python's tarfile do), ".." components are refused, nothing is written through a
// symlink, and symlinks whose target is absolute or
// resolves outside code_dir are refused. Regular files keep their permission bits; devices and
// FIFOs are skipped. An archive is bounded by `cap` (unpack_cap.h; default unbounded): one that
// unpacks to more fails with "ClientError: sagemaker_submit_directory <uri> unpacks to more than
// <max> <cap.bytes_origin>. ...". Archives are extracted into a staging directory beside code_dir
// that replaces code_dir only when complete, so a failed extraction leaves code_dir as it was.
// Errors: InvalidArgument "ClientError: ..." naming the URI (unreadable, unsafe or over-cap
// archive, missing object, unsupported scheme). A file:// directory is copied as it is (uncapped:
// it is already on the node).
Status DownloadSourceDir(objects::ObjectStore& store, const std::string& uri, const std::string& code_dir,
                         const UnpackCap& cap = UnpackCap());

// The job's FailureReason from <opt_ml>/output/failure: its first 1024 characters (Unicode code
// points; invalid UTF-8 bytes become U+FFFD), "" when the file is missing or empty.
std::string ReadFailureReason(const std::string& opt_ml);

}  // namespace kiln::agent
