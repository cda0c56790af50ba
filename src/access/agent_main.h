#pragma once
// `kiln agent`: the remote-access agent process (issue 16; the daemon's TunnelService starts one
// per connection). Not for people: the daemon passes everything on the command line.
//
//   kiln agent --pid <host pid> --socket-fd 3 [--events-fd 4] --authorized-key '<openssh line>'...
//              [--host-key <path>] [--working-directory <dir>]... [--keepalive-seconds N]
//
// In order: reads the workload's identity from /proc (instance_entry.h), creates the
// AgentSession (the host key is read from, or created in, the HOST's file system), opens the
// namespaces, joins the instance's cgroups, setns into cgroup/ipc/uts/net/pid/mnt, chdirs to the
// first --working-directory that exists inside ("/" when none), then serves the one SSH
// connection on --socket-fd. Events (AgentEvent) go to --events-fd as one JSON object per line:
//   {"event":"authenticated","user":"root"}   {"event":"shell-started"}
//   {"event":"shell","exit_status":0}         {"event":"exec-started","command":"ls"}
//   {"event":"exec","command":"ls","exit_status":2}   ({"signal":"KILL"} instead of exit_status)
//   {"event":"direct-tcpip","host":"localhost","port":6006}
//   {"event":"tcpip-forward","address":"127.0.0.1","port":12345}
//
// The agent dies with the thread that started it (PR_SET_PDEATHSIG SIGTERM: spawn it from a
// thread that lives as long as the connection). SIGTERM or SIGINT ends the connection: the
// transport is shut down, every child is killed and reaped, and the agent exits 0.
//
// Exit codes: 0 the connection was served (whatever the client did, including leaving without
// logging in or a failed key exchange: stderr then says so); 2 bad arguments; 3 the instance
// cannot be entered (the pid is gone, a namespace or cgroup cannot be joined, the host key
// cannot be read). Every non-zero exit writes one line to stderr saying why.

namespace kiln::access {

int RunAgentMain(int argc, char** argv);

}  // namespace kiln::access
