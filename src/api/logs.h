#pragma once
// CloudWatch Logs operations (spec/control-plane-api.md §11) on a JsonService
// ("Logs_20140328"): DescribeLogGroups, DescribeLogStreams, GetLogEvents, FilterLogEvents,
// CreateLogGroup, CreateLogStream, PutLogEvents, DeleteLogGroup, DeleteLogStream.
//
// Requests are validated against the botocore model (required members, name patterns and
// lengths, limit ranges) before the store sees them; every client error is
// InvalidParameterException, ResourceNotFoundException or ResourceAlreadyExistsException (400).
// ARNs use the request's account and region, falling back to the ones given here.
//
// Thread-safety: the handlers only call the (thread-safe) LogStore.

#include <memory>
#include <string>

#include "api/json_service.h"
#include "observe/log_store.h"

namespace kiln::api {

// `store` must outlive `service`.
void RegisterLogsOperations(JsonService* service, observe::LogStore* store, const std::string& account_id,
                            const std::string& region);

}  // namespace kiln::api
