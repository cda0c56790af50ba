#include "store/object_repository.h"

#include <unordered_set>
#include <utility>

namespace kiln::store {
namespace {

constexpr std::string_view kObjectColumns =
    "bucket, key, file_id, size, etag, last_modified_millis, headers_json, checksums_json, part_sizes_json, "
    "storage_class";

ObjectRow ReadObjectRow(const Statement& st) {
  ObjectRow row;
  row.bucket = st.ColumnText(0);
  row.key = st.ColumnBlob(1);
  row.file_id = st.ColumnText(2);
  row.size = static_cast<uint64_t>(st.ColumnInt64(3));
  row.etag = st.ColumnText(4);
  row.last_modified_millis = st.ColumnInt64(5);
  row.headers_json = st.ColumnText(6);
  row.checksums_json = st.ColumnText(7);
  row.part_sizes_json = st.ColumnText(8);
  row.storage_class = st.ColumnText(9);
  return row;
}

UploadRow ReadUploadRow(const Statement& st) {
  UploadRow row;
  row.upload_id = st.ColumnText(0);
  row.bucket = st.ColumnText(1);
  row.key = st.ColumnBlob(2);
  row.initiated_millis = st.ColumnInt64(3);
  row.headers_json = st.ColumnText(4);
  row.checksum_algorithm = st.ColumnText(5);
  return row;
}

constexpr std::string_view kUploadColumns =
    "upload_id, bucket, key, initiated_millis, headers_json, checksum_algorithm";

Status NoSuchUpload(const std::string& upload_id) {
  return Status::NotFound("NoSuchUpload: the specified upload does not exist: " + upload_id)
      .WithReason(ErrorReason::kNoSuchUpload);
}

// Every row `st` returns, each made by `read(st)`. Errors: the first failed Step().
template <typename Read>
auto ReadRows(Statement& st, Read read) -> Result<std::vector<decltype(read(st))>> {
  std::vector<decltype(read(st))> out;
  for (;;) {
    ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) break;
    out.push_back(read(st));
  }
  return out;
}

PartRow ReadPartRow(const Statement& st) {
  PartRow p;
  p.upload_id = st.ColumnText(0);
  p.part_number = static_cast<uint32_t>(st.ColumnInt64(1));
  p.file_id = st.ColumnText(2);
  p.size = static_cast<uint64_t>(st.ColumnInt64(3));
  p.etag = st.ColumnText(4);
  p.last_modified_millis = st.ColumnInt64(5);
  p.checksums_json = st.ColumnText(6);
  return p;
}

BucketRow ReadBucketRow(const Statement& st) {
  return BucketRow{st.ColumnText(0), st.ColumnText(1), st.ColumnInt64(2)};
}

void AppendUnique(std::vector<std::string>& out, const std::string& id) {
  if (id.empty()) return;
  for (const auto& existing : out) {
    if (existing == id) return;
  }
  out.push_back(id);
}

Result<std::vector<Extent>> ReadExtents(Database& db, const std::string& bucket, const std::string& key) {
  ASSIGN_OR_RETURN(auto st, db.Prepare("SELECT file_id, file_offset, length FROM object_extents "
                                       "WHERE bucket = ? AND key = ? ORDER BY seq"));
  st.BindText(1, bucket).BindBlob(2, key);
  return ReadRows(st, [](const Statement& s) {
    return Extent{s.ColumnText(0), static_cast<uint64_t>(s.ColumnInt64(1)), static_cast<uint64_t>(s.ColumnInt64(2))};
  });
}

// Deletes the extents rows of (bucket, key) and appends their file ids to `files`.
Status DeleteExtents(Database& db, const std::string& bucket, const std::string& key, std::vector<std::string>& files) {
  ASSIGN_OR_RETURN(auto st, db.Prepare("DELETE FROM object_extents WHERE bucket = ? AND key = ? RETURNING file_id"));
  st.BindText(1, bucket).BindBlob(2, key);
  for (;;) {
    ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) break;
    AppendUnique(files, st.ColumnText(0));
  }
  return Status::Ok();
}

Status WriteExtents(Database& db, const ObjectRow& row) {
  if (row.extents.empty()) return Status::Ok();
  ASSIGN_OR_RETURN(auto ins, db.Prepare("INSERT INTO object_extents(bucket, key, seq, file_id, file_offset, length) "
                                        "VALUES (?, ?, ?, ?, ?, ?)"));
  for (size_t i = 0; i < row.extents.size(); ++i) {
    const Extent& e = row.extents[i];
    ins.Reset();
    ins.BindText(1, row.bucket)
        .BindBlob(2, row.key)
        .BindInt64(3, static_cast<int64_t>(i))
        .BindText(4, e.file_id)
        .BindInt64(5, static_cast<int64_t>(e.offset))
        .BindInt64(6, static_cast<int64_t>(e.length));
    RETURN_IF_ERROR(ins.Run());
  }
  return Status::Ok();
}

}  // namespace

std::optional<std::string> PrefixUpperBound(std::string_view prefix) {
  std::string upper(prefix);
  while (!upper.empty()) {
    unsigned char last = static_cast<unsigned char>(upper.back());
    if (last != 0xff) {
      upper.back() = static_cast<char>(last + 1);
      return upper;
    }
    upper.pop_back();
  }
  return std::nullopt;
}

Status ObjectRepository::RequireBucket(const std::string& bucket) {
  ASSIGN_OR_RETURN(auto st, db_->Prepare("SELECT 1 FROM buckets WHERE name = ?"));
  st.BindText(1, bucket);
  ASSIGN_OR_RETURN(bool row, st.Step());
  if (!row)
    return Status::NotFound("NoSuchBucket: the specified bucket does not exist: " + bucket)
        .WithReason(ErrorReason::kNoSuchBucket);
  return Status::Ok();
}

Status ObjectRepository::CreateBucket(const BucketRow& row) {
  ASSIGN_OR_RETURN(auto st, db_->Prepare("INSERT INTO buckets(name, region, created_millis) VALUES (?, ?, ?)"));
  st.BindText(1, row.name).BindText(2, row.region).BindInt64(3, row.created_millis);
  Status s = st.Run();
  if (s.IsAlreadyExists()) return Status::AlreadyExists("bucket already exists: " + row.name);
  return s;
}

Status ObjectRepository::DeleteBucket(const std::string& name) {
  return db_->WithTransaction([&](Database& db) -> Status {
    RETURN_IF_ERROR(RequireBucket(name));
    {
      ASSIGN_OR_RETURN(auto st, db.Prepare("SELECT EXISTS(SELECT 1 FROM objects WHERE bucket = ?) OR "
                                           "EXISTS(SELECT 1 FROM multipart_uploads WHERE bucket = ?)"));
      st.BindText(1, name).BindText(2, name);
      ASSIGN_OR_RETURN(bool row, st.Step());
      if (row && st.ColumnInt64(0) != 0) {
        return Status::FailedPrecondition("BucketNotEmpty: the bucket you tried to delete is not empty: " + name)
            .WithReason(ErrorReason::kBucketNotEmpty);
      }
    }
    ASSIGN_OR_RETURN(auto del, db.Prepare("DELETE FROM buckets WHERE name = ?"));
    del.BindText(1, name);
    return del.Run();
  });
}

Result<BucketRow> ObjectRepository::GetBucket(const std::string& name) {
  ASSIGN_OR_RETURN(auto st, db_->Prepare("SELECT name, region, created_millis FROM buckets WHERE name = ?"));
  st.BindText(1, name);
  ASSIGN_OR_RETURN(bool row, st.Step());
  if (!row)
    return Status::NotFound("NoSuchBucket: the specified bucket does not exist: " + name)
        .WithReason(ErrorReason::kNoSuchBucket);
  return ReadBucketRow(st);
}

Result<std::vector<BucketRow>> ObjectRepository::ListBuckets() {
  ASSIGN_OR_RETURN(auto st, db_->Prepare("SELECT name, region, created_millis FROM buckets ORDER BY name"));
  return ReadRows(st, ReadBucketRow);
}

Result<ObjectRow> ObjectRepository::GetObject(const std::string& bucket, const std::string& key) {
  Result<ObjectRow> result = Status::Internal("unset");
  Status s = db_->WithTransaction([&](Database& db) -> Status {
    ASSIGN_OR_RETURN(
        auto st, db.Prepare("SELECT " + std::string(kObjectColumns) + " FROM objects WHERE bucket = ? AND key = ?"));
    st.BindText(1, bucket).BindBlob(2, key);
    ASSIGN_OR_RETURN(bool row, st.Step());
    if (row) {
      ObjectRow object = ReadObjectRow(st);
      // Rows from before migration 2 and single PUTs have a file id and no extents.
      if (object.file_id.empty()) {
        ASSIGN_OR_RETURN(object.extents, ReadExtents(db, bucket, key));
        if (object.extents.empty()) return Status::DataLoss("object has neither a data file nor extents");
      }
      result = std::move(object);
      return Status::Ok();
    }
    RETURN_IF_ERROR(RequireBucket(bucket));
    return Status::NotFound("NoSuchKey: the specified key does not exist").WithReason(ErrorReason::kNoSuchKey);
  });
  if (!s.ok()) return s;
  return result;
}

Result<std::vector<std::string>> ObjectRepository::PutObject(const ObjectRow& row, const WriteCondition& condition) {
  if (row.file_id.empty() == row.extents.empty()) {
    return Status::InvalidArgument("object row needs exactly one of file_id and extents");
  }
  std::vector<std::string> old_files;
  Status s = db_->WithTransaction([&](Database& db) -> Status {
    old_files.clear();
    RETURN_IF_ERROR(RequireBucket(row.bucket));
    {
      ASSIGN_OR_RETURN(auto st, db.Prepare("SELECT file_id, etag FROM objects WHERE bucket = ? AND key = ?"));
      st.BindText(1, row.bucket).BindBlob(2, row.key);
      ASSIGN_OR_RETURN(bool exists, st.Step());
      if (exists && condition.if_none_match_star) {
        return Status::FailedPrecondition("PreconditionFailed: the object already exists (If-None-Match: *)")
            .WithReason(ErrorReason::kPreconditionFailed);
      }
      if (condition.if_match.has_value() && (!exists || st.ColumnText(1) != *condition.if_match)) {
        return Status::FailedPrecondition("PreconditionFailed: the object's ETag does not match If-Match")
            .WithReason(ErrorReason::kPreconditionFailed);
      }
      if (exists) AppendUnique(old_files, st.ColumnText(0));
    }
    RETURN_IF_ERROR(DeleteExtents(db, row.bucket, row.key, old_files));
    ASSIGN_OR_RETURN(auto ins, db.Prepare("INSERT OR REPLACE INTO objects(" + std::string(kObjectColumns) +
                                          ") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"));
    ins.BindText(1, row.bucket)
        .BindBlob(2, row.key)
        .BindText(3, row.file_id)
        .BindInt64(4, static_cast<int64_t>(row.size))
        .BindText(5, row.etag)
        .BindInt64(6, row.last_modified_millis)
        .BindText(7, row.headers_json)
        .BindText(8, row.checksums_json)
        .BindText(9, row.part_sizes_json)
        .BindText(10, row.storage_class);
    RETURN_IF_ERROR(ins.Run());
    return WriteExtents(db, row);
  });
  if (!s.ok()) return s;
  return old_files;
}

Result<std::vector<std::string>> ObjectRepository::DeleteObject(const std::string& bucket, const std::string& key) {
  std::vector<std::string> old_files;
  Status s = db_->WithTransaction([&](Database& db) -> Status {
    old_files.clear();
    RETURN_IF_ERROR(RequireBucket(bucket));
    {
      ASSIGN_OR_RETURN(auto st, db.Prepare("DELETE FROM objects WHERE bucket = ? AND key = ? RETURNING file_id"));
      st.BindText(1, bucket).BindBlob(2, key);
      ASSIGN_OR_RETURN(bool row, st.Step());
      if (row) AppendUnique(old_files, st.ColumnText(0));
      RETURN_IF_ERROR(st.Run());
    }
    return DeleteExtents(db, bucket, key, old_files);
  });
  if (!s.ok()) return s;
  return old_files;
}

Result<std::vector<ObjectRow>> ObjectRepository::ScanObjects(const std::string& bucket, const std::string& lower,
                                                             bool lower_inclusive,
                                                             const std::optional<std::string>& upper, uint32_t limit) {
  std::string sql =
      "SELECT bucket, key, file_id, size, etag, last_modified_millis, '', '', '', storage_class "
      "FROM objects WHERE bucket = ? AND key ";
  sql += lower_inclusive ? ">= ?" : "> ?";
  if (upper.has_value()) sql += " AND key < ?";
  sql += " ORDER BY key LIMIT ?";
  ASSIGN_OR_RETURN(auto st, db_->Prepare(sql));
  st.BindText(1, bucket).BindBlob(2, lower);
  int next = 3;
  if (upper.has_value()) st.BindBlob(next++, *upper);
  st.BindInt64(next, limit);
  return ReadRows(st, ReadObjectRow);
}

Status ObjectRepository::CreateUpload(const UploadRow& row) {
  return db_->WithTransaction([&](Database& db) -> Status {
    RETURN_IF_ERROR(RequireBucket(row.bucket));
    ASSIGN_OR_RETURN(auto st, db.Prepare("INSERT INTO multipart_uploads(" + std::string(kUploadColumns) +
                                         ") VALUES (?, ?, ?, ?, ?, ?)"));
    st.BindText(1, row.upload_id)
        .BindText(2, row.bucket)
        .BindBlob(3, row.key)
        .BindInt64(4, row.initiated_millis)
        .BindText(5, row.headers_json)
        .BindText(6, row.checksum_algorithm);
    return st.Run();
  });
}

Result<UploadRow> ObjectRepository::GetUpload(const std::string& bucket, const std::string& key,
                                              const std::string& upload_id) {
  Result<UploadRow> result = Status::Internal("unset");
  Status s = db_->WithTransaction([&](Database& db) -> Status {
    RETURN_IF_ERROR(RequireBucket(bucket));
    ASSIGN_OR_RETURN(auto st, db.Prepare("SELECT " + std::string(kUploadColumns) +
                                         " FROM multipart_uploads WHERE upload_id = ? AND bucket = ? AND key = ?"));
    st.BindText(1, upload_id).BindText(2, bucket).BindBlob(3, key);
    ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) return NoSuchUpload(upload_id);
    result = ReadUploadRow(st);
    return Status::Ok();
  });
  if (!s.ok()) return s;
  return result;
}

Result<std::optional<std::string>> ObjectRepository::PutPart(const std::string& bucket, const std::string& key,
                                                             const PartRow& row) {
  std::optional<std::string> old_file;
  Status s = db_->WithTransaction([&](Database& db) -> Status {
    RETURN_IF_ERROR(GetUpload(bucket, key, row.upload_id));
    {
      ASSIGN_OR_RETURN(auto st,
                       db.Prepare("SELECT file_id FROM multipart_parts WHERE upload_id = ? AND part_number = ?"));
      st.BindText(1, row.upload_id).BindInt64(2, row.part_number);
      ASSIGN_OR_RETURN(bool exists, st.Step());
      if (exists) old_file = st.ColumnText(0);
    }
    ASSIGN_OR_RETURN(auto ins, db.Prepare("INSERT OR REPLACE INTO multipart_parts(upload_id, part_number, file_id, "
                                          "size, etag, last_modified_millis, checksums_json) "
                                          "VALUES (?, ?, ?, ?, ?, ?, ?)"));
    ins.BindText(1, row.upload_id)
        .BindInt64(2, row.part_number)
        .BindText(3, row.file_id)
        .BindInt64(4, static_cast<int64_t>(row.size))
        .BindText(5, row.etag)
        .BindInt64(6, row.last_modified_millis)
        .BindText(7, row.checksums_json);
    return ins.Run();
  });
  if (!s.ok()) return s;
  return old_file;
}

Result<std::vector<PartRow>> ObjectRepository::ListParts(const std::string& upload_id, uint32_t marker,
                                                         uint32_t limit) {
  ASSIGN_OR_RETURN(auto st, db_->Prepare("SELECT upload_id, part_number, file_id, size, etag, last_modified_millis, "
                                         "checksums_json FROM multipart_parts WHERE upload_id = ? AND "
                                         "part_number > ? ORDER BY part_number LIMIT ?"));
  st.BindText(1, upload_id).BindInt64(2, marker).BindInt64(3, limit == 0 ? -1 : static_cast<int64_t>(limit));
  return ReadRows(st, ReadPartRow);
}

Result<std::vector<std::string>> ObjectRepository::CompleteUpload(const std::string& bucket, const std::string& key,
                                                                  const std::string& upload_id,
                                                                  const ObjectRow& object) {
  std::vector<std::string> unreferenced;
  Status s = db_->WithTransaction([&](Database& db) -> Status {
    unreferenced.clear();
    RETURN_IF_ERROR(GetUpload(bucket, key, upload_id));
    ASSIGN_OR_RETURN(auto parts, ListParts(upload_id, 0, 0));
    std::unordered_set<std::string> part_files;
    for (const PartRow& p : parts) part_files.insert(p.file_id);
    // The caller chose the parts before this transaction; a part re-uploaded since then has a new
    // file and its old one (which an extent may name) is already being unlinked.
    std::unordered_set<std::string> adopted;
    for (const Extent& e : object.extents) {
      if (part_files.count(e.file_id) == 0) {
        return Status::Aborted("a part was replaced during completion; retry");
      }
      adopted.insert(e.file_id);
    }
    if (!object.file_id.empty()) adopted.insert(object.file_id);
    for (const PartRow& p : parts) {
      if (adopted.count(p.file_id) == 0) unreferenced.push_back(p.file_id);
    }
    {
      ASSIGN_OR_RETURN(auto del, db.Prepare("DELETE FROM multipart_uploads WHERE upload_id = ?"));
      del.BindText(1, upload_id);
      RETURN_IF_ERROR(del.Run());
    }
    ASSIGN_OR_RETURN(auto old, PutObject(object, WriteCondition{}));
    for (const auto& id : old) AppendUnique(unreferenced, id);
    return Status::Ok();
  });
  if (!s.ok()) return s;
  return unreferenced;
}

Result<std::vector<std::string>> ObjectRepository::AbortUpload(const std::string& bucket, const std::string& key,
                                                               const std::string& upload_id) {
  std::vector<std::string> files;
  Status s = db_->WithTransaction([&](Database& db) -> Status {
    files.clear();
    RETURN_IF_ERROR(GetUpload(bucket, key, upload_id));
    ASSIGN_OR_RETURN(auto parts, ListParts(upload_id, 0, 0));
    for (const PartRow& p : parts) files.push_back(p.file_id);
    ASSIGN_OR_RETURN(auto del, db.Prepare("DELETE FROM multipart_uploads WHERE upload_id = ?"));
    del.BindText(1, upload_id);
    return del.Run();
  });
  if (!s.ok()) return s;
  return files;
}

Result<std::vector<UploadRow>> ObjectRepository::ListUploads(const std::string& bucket, const std::string& prefix,
                                                             const std::string& key_marker,
                                                             const std::string& upload_id_marker, uint32_t limit) {
  RETURN_IF_ERROR(RequireBucket(bucket));
  std::optional<std::string> upper = PrefixUpperBound(prefix);
  std::string sql = "SELECT " + std::string(kUploadColumns) + " FROM multipart_uploads WHERE bucket = ? AND key >= ?";
  if (upper.has_value()) sql += " AND key < ?";
  if (!key_marker.empty() || !upload_id_marker.empty()) {
    sql += upload_id_marker.empty() ? " AND key > ?" : " AND (key > ? OR (key = ? AND upload_id > ?))";
  }
  sql += " ORDER BY key, upload_id LIMIT ?";
  ASSIGN_OR_RETURN(auto st, db_->Prepare(sql));
  st.BindText(1, bucket).BindBlob(2, prefix);
  int next = 3;
  if (upper.has_value()) st.BindBlob(next++, *upper);
  if (!key_marker.empty() || !upload_id_marker.empty()) {
    st.BindBlob(next++, key_marker);
    if (!upload_id_marker.empty()) {
      st.BindBlob(next++, key_marker);
      st.BindText(next++, upload_id_marker);
    }
  }
  st.BindInt64(next, limit);
  return ReadRows(st, ReadUploadRow);
}

Result<std::unordered_set<std::string>> ObjectRepository::AllFileIds() {
  ASSIGN_OR_RETURN(auto st, db_->Prepare("SELECT file_id FROM objects UNION ALL SELECT file_id FROM object_extents "
                                         "UNION ALL SELECT file_id FROM multipart_parts"));
  std::unordered_set<std::string> ids;
  for (;;) {
    ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) break;
    std::string id = st.ColumnText(0);
    if (!id.empty()) ids.insert(std::move(id));  // multi-extent objects have file_id ''
  }
  return ids;
}

}  // namespace kiln::store
