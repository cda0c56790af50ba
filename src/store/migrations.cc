#include "store/migrations.h"

namespace kiln::store {

const std::vector<Migration>& AllMigrations() {
  // Object keys are BLOBs so that SQLite compares them with memcmp: S3 lists keys in UTF-8 byte
  // order, and any byte string is a valid key. Tables keyed by (bucket, key) are WITHOUT ROWID so
  // that the primary key is the clustered index and prefix listings are range scans.
  static const std::vector<Migration> kMigrations = {
      {1, "object store metadata", R"sql(
CREATE TABLE buckets (
  name TEXT PRIMARY KEY NOT NULL,
  region TEXT NOT NULL,
  created_millis INTEGER NOT NULL
);
CREATE TABLE objects (
  bucket TEXT NOT NULL REFERENCES buckets(name),
  key BLOB NOT NULL,
  file_id TEXT NOT NULL,
  size INTEGER NOT NULL,
  etag TEXT NOT NULL,
  last_modified_millis INTEGER NOT NULL,
  headers_json TEXT NOT NULL,
  checksums_json TEXT NOT NULL,
  part_sizes_json TEXT NOT NULL,
  storage_class TEXT NOT NULL,
  PRIMARY KEY (bucket, key)
) WITHOUT ROWID;
CREATE TABLE multipart_uploads (
  upload_id TEXT PRIMARY KEY NOT NULL,
  bucket TEXT NOT NULL REFERENCES buckets(name),
  key BLOB NOT NULL,
  initiated_millis INTEGER NOT NULL,
  headers_json TEXT NOT NULL,
  checksum_algorithm TEXT NOT NULL
);
CREATE INDEX multipart_uploads_by_key ON multipart_uploads(bucket, key, upload_id);
CREATE TABLE multipart_parts (
  upload_id TEXT NOT NULL REFERENCES multipart_uploads(upload_id) ON DELETE CASCADE,
  part_number INTEGER NOT NULL,
  file_id TEXT NOT NULL,
  size INTEGER NOT NULL,
  etag TEXT NOT NULL,
  last_modified_millis INTEGER NOT NULL,
  checksums_json TEXT NOT NULL,
  PRIMARY KEY (upload_id, part_number)
) WITHOUT ROWID;
)sql"},
      // A multipart object adopts its part files as an ordered list of extents instead of having
      // them concatenated into one file. objects.file_id is '' for such an object; an object with
      // a file_id and no extents rows (every row written before this migration, and every single
      // PUT) is that one whole file. No foreign key to objects: rows are replaced with INSERT OR
      // REPLACE, so the repository deletes an object's extents itself in the same transaction.
      {2, "object extents", R"sql(
CREATE TABLE object_extents (
  bucket TEXT NOT NULL,
  key BLOB NOT NULL,
  seq INTEGER NOT NULL,
  file_id TEXT NOT NULL,
  file_offset INTEGER NOT NULL,
  length INTEGER NOT NULL,
  PRIMARY KEY (bucket, key, seq)
) WITHOUT ROWID;
)sql"},
      // CloudWatch Logs metadata (observe::LogStore). Events live in one file per stream, named
      // by the stream's id; these rows only describe them. Names are TEXT: group names are ASCII
      // by pattern and stream names are compared as UTF-8, both in byte order (BINARY collation).
      {3, "log groups and streams", R"sql(
CREATE TABLE log_groups (
  name TEXT PRIMARY KEY NOT NULL,
  created_millis INTEGER NOT NULL
);
CREATE TABLE log_streams (
  id TEXT PRIMARY KEY NOT NULL,
  group_name TEXT NOT NULL REFERENCES log_groups(name) ON DELETE CASCADE,
  name TEXT NOT NULL,
  created_millis INTEGER NOT NULL,
  first_event_millis INTEGER,
  last_event_millis INTEGER,
  last_ingestion_millis INTEGER,
  stored_bytes INTEGER NOT NULL DEFAULT 0,
  event_count INTEGER NOT NULL DEFAULT 0,
  UNIQUE (group_name, name)
);
)sql"},
      // SageMaker training jobs (api/training_jobs, control/training_controller). The validated
      // request is kept verbatim so Describe echoes exactly what was asked; the observed state
      // (secondary status transitions, failure reason, artifacts, metrics, instance bookkeeping)
      // is one JSON document rewritten with each step. `seq` is the submission order the
      // scheduler starts waiting jobs in. Names are unique case-insensitively (NOCASE), as AWS
      // treats them.
      {4, "training jobs and tags", R"sql(
CREATE TABLE training_jobs (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  name TEXT NOT NULL UNIQUE COLLATE NOCASE,
  arn TEXT NOT NULL,
  request_json TEXT NOT NULL,
  status TEXT NOT NULL,
  secondary_status TEXT NOT NULL,
  creation_millis INTEGER NOT NULL,
  last_modified_millis INTEGER NOT NULL,
  training_end_millis INTEGER,
  state_json TEXT NOT NULL,
  version INTEGER NOT NULL DEFAULT 1
);
CREATE INDEX training_jobs_by_creation ON training_jobs(creation_millis, name);
CREATE INDEX training_jobs_by_status ON training_jobs(status, seq);
CREATE TABLE resource_tags (
  resource_arn TEXT NOT NULL COLLATE NOCASE,
  seq INTEGER NOT NULL,
  key TEXT NOT NULL,
  value TEXT NOT NULL,
  PRIMARY KEY (resource_arn, key)
) WITHOUT ROWID;
)sql"},
      // Metric time series (observe/metric_store): one row per (namespace, name, dimensions)
      // with its latest point (DescribeTrainingJob.FinalMetricDataList reads it without a
      // scan), and the points, read back in time order per series.
      {5, "metric series and points", R"sql(
CREATE TABLE metric_series (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  namespace TEXT NOT NULL,
  name TEXT NOT NULL,
  dimensions TEXT NOT NULL,
  last_millis INTEGER,
  last_value REAL,
  UNIQUE (namespace, name, dimensions)
);
CREATE TABLE metric_points (
  series_id INTEGER NOT NULL,
  timestamp_millis INTEGER NOT NULL,
  value REAL NOT NULL
);
CREATE INDEX metric_points_by_series_time ON metric_points(series_id, timestamp_millis);
)sql"},
      // Real-time inference (store/endpoint_repository.h). Models and endpoint configurations are
      // immutable: the validated Create* request verbatim. An endpoint keeps its deployment (the
      // configuration and models copied at Create/UpdateEndpoint time), the pending deployment of
      // an update in flight (NULL otherwise), the API's desired weights and counts, and the
      // controller's observed state. Names are unique case-insensitively (NOCASE); `seq` is the
      // creation order. Tags stay in resource_tags, keyed by ARN.
      {6, "models, endpoint configurations and endpoints", R"sql(
CREATE TABLE models (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  name TEXT NOT NULL UNIQUE COLLATE NOCASE,
  arn TEXT NOT NULL,
  request_json TEXT NOT NULL,
  creation_millis INTEGER NOT NULL
);
CREATE TABLE endpoint_configs (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  name TEXT NOT NULL UNIQUE COLLATE NOCASE,
  arn TEXT NOT NULL,
  request_json TEXT NOT NULL,
  creation_millis INTEGER NOT NULL
);
CREATE TABLE endpoints (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  name TEXT NOT NULL UNIQUE COLLATE NOCASE,
  arn TEXT NOT NULL,
  config_name TEXT NOT NULL,
  status TEXT NOT NULL,
  failure_reason TEXT NOT NULL,
  creation_millis INTEGER NOT NULL,
  last_modified_millis INTEGER NOT NULL,
  request_json TEXT NOT NULL,
  deployment_json TEXT NOT NULL,
  pending_json TEXT,
  desired_json TEXT NOT NULL,
  state_json TEXT NOT NULL,
  version INTEGER NOT NULL DEFAULT 1
);
CREATE INDEX endpoints_by_status ON endpoints(status, seq);
)sql"},
      // Metric points as CloudWatch statistic sets (observe/metric_store.h, issue 10): each point
      // keeps SampleCount, Sum, Minimum, Maximum, its unit and storage resolution, and optionally
      // its distribution (packed (value, count) doubles) for percentiles. The table is clustered
      // on (series, time, seq) (WITHOUT ROWID) so a period query is one sequential range scan, not
      // an index probe per point; `seq` orders equal timestamps in write order (old rows keep
      // their rowid). Old rows become single-sample points (count 1, every statistic = value).
      {7, "metric points as statistic sets", R"sql(
CREATE TABLE metric_points_v7 (
  series_id INTEGER NOT NULL,
  timestamp_millis INTEGER NOT NULL,
  seq INTEGER NOT NULL,
  sample_count REAL NOT NULL,
  sum REAL NOT NULL,
  minimum REAL NOT NULL,
  maximum REAL NOT NULL,
  unit TEXT NOT NULL,
  storage_resolution INTEGER NOT NULL,
  distribution BLOB,
  PRIMARY KEY (series_id, timestamp_millis, seq)
) WITHOUT ROWID;
INSERT INTO metric_points_v7 (series_id, timestamp_millis, seq, sample_count, sum, minimum, maximum, unit,
                              storage_resolution, distribution)
  SELECT series_id, timestamp_millis, rowid, 1, value, value, value, 'None', 60, NULL FROM metric_points;
DROP TABLE metric_points;
ALTER TABLE metric_points_v7 RENAME TO metric_points;
)sql"},
      // Keyset listing (store/list_query.h, issue 11): one index per (filter, sort) a List*
      // page can ask for, each ending in the name, the tie-breaker, so a page is an index range
      // of `limit` entries. Sorting by name uses the names' UNIQUE (NOCASE) index; the
      // last-modified index serves LastModifiedTime filters. training_jobs_by_status (status, seq)
      // stays for the scheduler's active-job scan.
      {8, "indexes for keyset listing", R"sql(
CREATE INDEX training_jobs_by_status_name ON training_jobs(status, name);
CREATE INDEX training_jobs_by_status_creation ON training_jobs(status, creation_millis, name);
CREATE INDEX training_jobs_by_modified ON training_jobs(last_modified_millis);
CREATE INDEX models_by_creation ON models(creation_millis, name);
CREATE INDEX endpoint_configs_by_creation ON endpoint_configs(creation_millis, name);
CREATE INDEX endpoints_by_creation ON endpoints(creation_millis, name);
CREATE INDEX endpoints_by_status_name ON endpoints(status, name);
CREATE INDEX endpoints_by_status_creation ON endpoints(status, creation_millis, name);
CREATE INDEX endpoints_by_modified ON endpoints(last_modified_millis);
)sql"},
      // DescribeLogStreams by LastEventTime (observe::LogStore::ListStreams): a stream without
      // events sorts as 0, so the index is on that expression, ending in the name (the
      // tie-breaker) for keyset pages. Ordering by name uses UNIQUE (group_name, name).
      {9, "log streams by last event time", R"sql(
CREATE INDEX log_streams_by_last_event ON log_streams(group_name, coalesce(last_event_millis, 0), name);
)sql"},
      // Remote-access audit (spec remote-access.md R-26; store/remote_connection_repository.h): one
      // row per tunnel, written when it opens and completed when it closes (end_millis NULL while
      // open). Forwards and exec exit statuses are JSON lists. Listed newest first, per resource.
      {10, "remote access connections", R"sql(
CREATE TABLE remote_connections (
  id TEXT PRIMARY KEY NOT NULL,
  resource_arn TEXT NOT NULL COLLATE NOCASE,
  target TEXT NOT NULL,
  principal TEXT NOT NULL,
  source_address TEXT NOT NULL,
  start_millis INTEGER NOT NULL,
  end_millis INTEGER,
  bytes_in INTEGER NOT NULL DEFAULT 0,
  bytes_out INTEGER NOT NULL DEFAULT 0,
  forwards_json TEXT NOT NULL DEFAULT '[]',
  exit_statuses_json TEXT NOT NULL DEFAULT '[]',
  close_reason TEXT NOT NULL DEFAULT ''
);
CREATE INDEX remote_connections_by_start ON remote_connections(start_millis, id);
CREATE INDEX remote_connections_by_resource ON remote_connections(resource_arn, start_millis, id);
)sql"},
      // Hyperparameter tuning jobs (store/tuning_job_repository.h, issue 17), laid out as
      // training_jobs: the validated request verbatim, typed columns for lists, the controller's
      // state (trials, completion bookkeeping) as one JSON document. Names are unique
      // case-insensitively (NOCASE); `seq` is the creation order the controller reconciles in.
      // One index per (filter, sort) of a ListHyperParameterTuningJobs page (as migrations 4 and
      // 8 for training jobs), each ending in the name, the keyset tie-breaker; (status, seq)
      // serves ListActive.
      {11, "hyperparameter tuning jobs", R"sql(
CREATE TABLE tuning_jobs (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  name TEXT NOT NULL UNIQUE COLLATE NOCASE,
  arn TEXT NOT NULL,
  request_json TEXT NOT NULL,
  status TEXT NOT NULL,
  creation_millis INTEGER NOT NULL,
  last_modified_millis INTEGER NOT NULL,
  end_millis INTEGER,
  state_json TEXT NOT NULL,
  version INTEGER NOT NULL DEFAULT 1
);
CREATE INDEX tuning_jobs_by_creation ON tuning_jobs(creation_millis, name);
CREATE INDEX tuning_jobs_by_status ON tuning_jobs(status, seq);
CREATE INDEX tuning_jobs_by_status_name ON tuning_jobs(status, name);
CREATE INDEX tuning_jobs_by_status_creation ON tuning_jobs(status, creation_millis, name);
CREATE INDEX tuning_jobs_by_modified ON tuning_jobs(last_modified_millis);
)sql"},
      // Processing jobs (store/processing_job_repository.h, issue 18), laid out as tuning_jobs: the
      // validated CreateProcessingJob request verbatim, typed columns for lists, the controller's
      // observed state (hosts, exit codes, failure reason, exit message) as one JSON document.
      // Names are unique case-insensitively (NOCASE); `seq` is the creation order the controller
      // reconciles in. One index per (filter, sort) of a ListProcessingJobs page, each ending in
      // the name, the keyset tie-breaker; (status, seq) serves ListActive.
      {12, "processing jobs", R"sql(
CREATE TABLE processing_jobs (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  name TEXT NOT NULL UNIQUE COLLATE NOCASE,
  arn TEXT NOT NULL,
  request_json TEXT NOT NULL,
  status TEXT NOT NULL,
  creation_millis INTEGER NOT NULL,
  last_modified_millis INTEGER NOT NULL,
  end_millis INTEGER,
  state_json TEXT NOT NULL,
  version INTEGER NOT NULL DEFAULT 1
);
CREATE INDEX processing_jobs_by_creation ON processing_jobs(creation_millis, name);
CREATE INDEX processing_jobs_by_status ON processing_jobs(status, seq);
CREATE INDEX processing_jobs_by_status_name ON processing_jobs(status, name);
CREATE INDEX processing_jobs_by_status_creation ON processing_jobs(status, creation_millis, name);
CREATE INDEX processing_jobs_by_modified ON processing_jobs(last_modified_millis);
)sql"},
      // Application Auto Scaling (store/autoscaling_repository.h, issue 19): scalable targets,
      // scaling policies, scheduled actions and scaling activities in one table, told apart by
      // `kind`. Each row is keyed by (kind, namespace, resource id, dimension, name) — the name
      // is '' for a target and the activity id for an activity — and carries the API's document
      // and the scaler's state as JSON. `seq` orders listings and pages.
      {13, "application autoscaling", R"sql(
CREATE TABLE autoscaling_objects (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  kind TEXT NOT NULL,
  service_namespace TEXT NOT NULL,
  resource_id TEXT NOT NULL,
  scalable_dimension TEXT NOT NULL,
  name TEXT NOT NULL,
  creation_millis INTEGER NOT NULL,
  doc_json TEXT NOT NULL,
  state_json TEXT NOT NULL,
  UNIQUE (kind, service_namespace, resource_id, scalable_dimension, name)
);
CREATE INDEX autoscaling_objects_by_kind ON autoscaling_objects(kind, service_namespace, seq);
CREATE INDEX autoscaling_objects_by_resource ON autoscaling_objects(kind, resource_id, seq);
)sql"},
      // Batch transform jobs (store/transform_job_repository.h, issue 20), laid out as
      // processing_jobs: the validated CreateTransformJob request, typed columns for lists, the
      // observed state (the model snapshot, start time, failure reason, stop request) as JSON.
      {14, "transform jobs", R"sql(
CREATE TABLE transform_jobs (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  name TEXT NOT NULL UNIQUE COLLATE NOCASE,
  arn TEXT NOT NULL,
  request_json TEXT NOT NULL,
  status TEXT NOT NULL,
  creation_millis INTEGER NOT NULL,
  last_modified_millis INTEGER NOT NULL,
  end_millis INTEGER,
  state_json TEXT NOT NULL,
  version INTEGER NOT NULL DEFAULT 1
);
CREATE INDEX transform_jobs_by_creation ON transform_jobs(creation_millis, name);
CREATE INDEX transform_jobs_by_status ON transform_jobs(status, seq);
CREATE INDEX transform_jobs_by_status_name ON transform_jobs(status, name);
CREATE INDEX transform_jobs_by_status_creation ON transform_jobs(status, creation_millis, name);
CREATE INDEX transform_jobs_by_modified ON transform_jobs(last_modified_millis);
)sql"},
  };
  return kMigrations;
}

}  // namespace kiln::store
