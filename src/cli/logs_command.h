#pragma once
// `kiln logs <training job> [-f]`: prints a training job's log streams the way the SageMaker SDK
// tails them (DescribeLogStreams with prefix "<job>/", then GetLogEvents from the head of each
// stream), through the server's public Logs API with SigV4 like any client. With --follow it
// keeps polling until the job has reached a terminal status and every line has been printed.

#include <iosfwd>
#include <string>

#include "aws/credentials.h"
#include "base/status.h"

namespace kiln::cli {

struct LogsCommandOptions {
  std::string endpoint;  // http://host:port
  std::string region = "us-east-1";
  aws::Credential credential;
  std::string job_name;
  bool follow = false;
  bool show_stream_names = false;  // prefix each line with its stream when the job has several hosts
  int poll_millis = 500;
};

// Writes the lines to `out`; with --follow, the job's final status to `status_out` (stderr) so
// that stdout holds exactly the logged lines. Errors: the job does not exist, the server is unreachable, or an
// error answer (its AWS code and message).
Status RunLogsCommand(const LogsCommandOptions& options, std::ostream& out, std::ostream& status_out);

}  // namespace kiln::cli
