"""NCCL's RAS client socket, as NCCL 2.24 to 2.30 answer on it, for a job described in JSON.

What a real NCCL process's RAS thread does for a client (NVIDIA/nccl src/ras/client_support.cc,
rasClientEventLoop and the report's writers; docs/userguide/source/troubleshooting/ras.rst):
- reads lines (a trailing \\r is dropped, for telnet), case-insensitive commands;
- "CLIENT PROTOCOL <n>" -> "SERVER PROTOCOL 2" whatever n is;
- "TIMEOUT <s>" -> "OK", or "ERROR: Invalid timeout value <s>";
- "SET FORMAT text|json" (2.28.7 and later) -> "OK", or "ERROR: Invalid format <f>"; before 2.28.7
  "ERROR: Unknown command SET FORMAT ...", as for any command it does not know;
- "STATUS" / "VERBOSE STATUS" -> the report, then it closes the connection. The text report: the
  version lines, the job summary, the communicators' table (Errors: OK, MISMATCH, INCOMPLETE, ...),
  then Errors (INCOMPLETE, DEAD processes; per communicator its missing ranks: by list before 2.26,
  one line each since) and Warnings (collective counts apart: one count before 2.26, one per
  operation since), naming a group's ranks only when it is an outlier (rasCountIsOutlier). The
  JSON (2.28.7 and later): every rank with its status and collective counts, the missing ranks,
  with 2.28.7 to 2.28.9's missing comma after a missing rank's "nvml_dev".
MONITOR (2.29) is not modelled; it is answered as an unknown command.

The job (--job FILE): {"nccl_version": "2.29.2", "communicators": [{"hash": "0x...", "size": N,
"ranks": [{"rank", "host", "pid", "gpu", "counts": {"AllReduce": 6650, ...}}],
"missing": [{"rank", "host", "pid", "gpu", "dead": false}]}]}. Counts not given are 0. A job whose
ranks are all present with equal counts is the RAS that says OK while ranks hang (NVIDIA/nccl#1730).

    python3 tests/stand_ins/nccl_ras.py --job JOB.json --listen 127.0.0.1:28028 [--log FILE]
prints "listening HOST:PORT" once it accepts connections, and serves until killed.
"""

from __future__ import annotations

import argparse
import json
import socketserver
import sys
import threading

OPERATIONS = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")  # ncclFuncStr
ERRORS = ("OK", "MISMATCH", "ERROR", "ERROR,MISMATCH", "INCOMPLETE", "INCOMPLETE,MISMATCH", "INCOMPLETE,ERROR",
          "INCOMPLETE,ERROR,MISMATCH")  # errorStr, indexed by the MISMATCH=1, ERROR=2, INCOMPLETE=4 bits


def version(job: dict) -> tuple:
    return tuple(int(part) for part in job["nccl_version"].split(".")[:3])


def outlier(count: int, total: int = -1) -> bool:
    """rasCountIsOutlier, not verbose: one is always named; else at most 10 and at most a quarter."""
    if count == 1:
        return True
    return count <= 10 and (total == -1 or count <= total * 0.25)


def counts(rank: dict) -> dict:
    return {op: int((rank.get("counts") or {}).get(op, 0)) for op in OPERATIONS}


def render_json(job: dict) -> str:
    """As jsonWriteHeader, jsonStartCommunicator, jsonWriteRankData, jsonWriteMissingRank and
    jsonWriteFooter print it, spacing included."""
    missing_comma = (2, 28, 7) <= version(job) < (2, 29, 0)
    out = ["{\n", f'  "nccl_version": "{job["nccl_version"]}",\n', '  "cuda_runtime_version": 12080,\n',
           '  "cuda_driver_version": 12080,\n', '  "timestamp": "2026-12-01 12:00:00",\n',
           f'  "communicators_count": {len(job["communicators"])},\n', '  "communicators": [\n']
    for index, comm in enumerate(job["communicators"]):
        ranks, missing = comm.get("ranks", []), comm.get("missing", [])
        out += [",\n" if index else "", "    {\n", f'      "hash": "{comm["hash"]}",\n',
                '      "secondary_hash": "0x1:0x2",\n', f'      "size": {comm["size"]},\n',
                f'      "ranks_count": {len(ranks)},\n', f'      "missing_ranks_count": {len(missing)},\n',
                '      "ranks": [\n']
        for i, rank in enumerate(ranks):
            status = {"init_state": 0, "async_error": 0, "finalize_called": False, "destroy_flag": False,
                      "abort_flag": False, **(rank.get("status") or {})}
            out += [",\n" if i else "", "        {\n", f'          "rank": {rank["rank"]},\n',
                    f'          "host": "{rank["host"]}",\n', f'          "pid": {rank["pid"]},\n',
                    f'          "cuda_dev": {rank.get("gpu", 0)},\n', f'          "nvml_dev": {rank.get("gpu", 0)},\n',
                    '          "status": {\n', f'            "init_state": {status["init_state"]},\n',
                    f'            "async_error": {status["async_error"]},\n']
            out += [f'            "{name}": {json.dumps(status[name])}' + (",\n" if name != "abort_flag" else "\n")
                    for name in ("finalize_called", "destroy_flag", "abort_flag")]
            out += ["          },\n", '          "collective_counts": {\n']
            values = counts(rank)
            out += [f'            "{op}": {values[op]}' + ("," if op != OPERATIONS[-1] else "") + "\n"
                    for op in OPERATIONS]
            out += ["          }\n", "        }"]
        out += ["\n      ],\n", '      "missing_ranks": [\n']
        for i, rank in enumerate(missing):
            out += [",\n" if i else "", "        {\n", f'          "rank": {rank["rank"]},\n',
                    f'          "host": "{rank["host"]}",\n', f'          "pid": {rank["pid"]},\n',
                    f'          "cuda_dev": {rank.get("gpu", 0)},\n',
                    f'          "nvml_dev": {rank.get("gpu", 0)}' + ("\n" if missing_comma else ",\n"),
                    '          "status": {\n', '            "unresponsive": true,\n',
                    f'            "considered_dead": {json.dumps(bool(rank.get("dead")))}\n', "          }\n",
                    "        }"]
        out += ["\n      ]\n", "    }"]
    out += ["\n  ],\n", '  "ras": {\n', '    "collection_time_sec": 0.004,\n', '    "timeouts_count": 0\n',
            "  }\n", "}\n"]
    return "".join(out)


def render_text(job: dict) -> str:
    """As rasClientRunInit and rasClientRunComms print it for a job of uniform nodes."""
    since_2_26 = version(job) >= (2, 26, 0)
    comms = job["communicators"]
    processes = {(r["host"], r["pid"]): r for c in comms for r in (*c.get("ranks", []), *c.get("missing", []))}
    hosts = sorted({host for host, _ in processes})
    out = [f"NCCL version {job['nccl_version']} compiled with CUDA 12.8\n",
           "CUDA runtime version 12080, driver version 12080\n\n",
           "Job summary\n===========\n\n",
           "  Nodes  Processes         GPUs  Processes     GPUs\n",
           "(total)   per node  per process    (total)  (total)\n",
           f"{len(hosts):7d}  {len(processes) // max(1, len(hosts)):9d}  {1:11d}  {len(processes):9d}  "
           f"{len(processes):7d}\n", "\nCommunicators... (0.004s)\n=============\n\n",
           "Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors\n",
           "    #  in group  per comm  per node  per comm  in group\n"]
    for index, comm in enumerate(comms):
        per_node = comm["size"] // max(1, len({r["host"] for r in (*comm.get("ranks", []), *comm.get("missing", []))}))
        out.append(f"{index:5d}  {1:8d}  {len(hosts):8d}  {str(per_node):>8}  {comm['size']:8d}  {comm['size']:8d}  "
                   f"{'RUNNING':>8}  {ERRORS[errors(comm, since_2_26)]:>6}\n")
    out.append("\nErrors\n======\n\n")
    missing = [r for c in comms for r in c.get("missing", []) if not r.get("dead")]
    if missing:
        out.append(f"INCOMPLETE\n  Missing communicator data from {len(missing)} job process"
                   f"{'es' if len(missing) > 1 else ''}\n")
        if outlier(len(missing)):
            out += [f"  Process {r['pid']} on node {r['host']} managing GPU {r.get('gpu', 0)}\n" for r in missing]
        out.append("\n")
    dead = [r for c in comms for r in c.get("missing", []) if r.get("dead")]
    if dead:
        out.append(f"DEAD\n  {len(dead)} job process{'es are' if len(dead) > 1 else ' is'} considered dead "
                   "(unreachable via the RAS network)\n")
        if outlier(len(dead)):
            out += [f"  Process {r['pid']} on node {r['host']} managing GPU {r.get('gpu', 0)}\n" for r in dead]
        out.append("\n")
    for index, comm in enumerate(comms):
        absent = comm.get("missing", [])
        if not absent:
            continue
        out.append(f"#{index}-0 ({int(comm['hash'], 16):016x}) INCOMPLETE\n  Missing communicator data from "
                   f"{len(absent)} rank{'s' if len(absent) > 1 else ''}\n")
        if outlier(len(absent)):
            if since_2_26:
                out += [f"  Rank {r['rank']} -- GPU {r.get('gpu', 0)} managed by process {r['pid']} on node "
                        f"{r['host']}\n" for r in absent]
            else:
                out.append(f"  The missing rank{'s' if len(absent) > 1 else ''}: "
                           f"{','.join(str(r['rank']) for r in absent)}\n")
        out.append("\n")
    out.append("Warnings\n========\n\n")
    for index, comm in enumerate(comms):
        gaps = count_gaps(comm, since_2_26)
        if not gaps:
            continue
        out.append(f"#{index}-0 ({int(comm['hash'], 16):016x}) MISMATCH\n")
        for operation, by_count in gaps:
            out.append(f"  Communicator ranks have different {operation} operation counts\n")
            for value, ranks in sorted(by_count.items(), key=lambda item: -len(item[1])):
                if len(ranks) > 1:
                    out.append(f"  {len(ranks)} ranks have launched up to operation {value}\n" if value else
                               f"  {len(ranks)} ranks have not launched any operations\n")
                if outlier(len(ranks), comm["size"]):
                    for rank in ranks:
                        place = f"GPU {rank.get('gpu', 0)} managed by process {rank['pid']} on node {rank['host']}"
                        if len(ranks) > 1:
                            out.append(f"  Rank {rank['rank']} -- {place}\n")
                        elif value:
                            out.append(f"  Rank {rank['rank']} has launched up to operation {value} -- {place}\n")
                        else:
                            out.append(f"  Rank {rank['rank']} has not launched any operations -- {place}\n")
            out.append("\n")
    return "".join(out)


def count_gaps(comm: dict, per_operation: bool) -> list:
    """[(operation, {count: [ranks]})] for the operations whose counts differ (before 2.26 one
    "collective" count, the sum)."""
    ranks = sorted(comm.get("ranks", []), key=lambda r: r["rank"])
    keyed = [(op, lambda r, op=op: counts(r)[op]) for op in OPERATIONS] if per_operation else \
        [("collective", lambda r: sum(counts(r).values()))]
    gaps = []
    for operation, value in keyed:
        by_count: dict = {}
        for rank in ranks:
            by_count.setdefault(value(rank), []).append(rank)
        if len(by_count) > 1:
            gaps.append((operation, by_count))
    return gaps


def errors(comm: dict, per_operation: bool) -> int:
    return (4 if comm.get("missing") else 0) | (1 if count_gaps(comm, per_operation) else 0)


class Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        job, log = self.server.job, self.server.log
        json_format = False
        for raw in self.rfile:
            command = raw.decode(errors="replace").rstrip("\n").rstrip("\r")
            log.append(command)
            lower = command.lower()
            if lower.startswith("client protocol "):
                self.wfile.write(b"SERVER PROTOCOL 2\n")
            elif lower.startswith("timeout "):
                value = command[len("timeout "):]
                self.wfile.write(b"OK\n" if value.isdigit() else f"ERROR: Invalid timeout value {value}\n".encode())
            elif lower.startswith("set format ") and version(job) >= (2, 28, 7):
                wanted = command[len("set format "):]
                if wanted.lower() in ("text", "json"):
                    json_format = wanted.lower() == "json"
                    self.wfile.write(b"OK\n")
                else:
                    self.wfile.write(f"ERROR: Invalid format {wanted}\n".encode())
            elif lower in ("status", "verbose status"):
                self.wfile.write((render_json(job) if json_format else render_text(job)).encode())
                return  # RAS_CLIENT_FINISHED: the server closes the connection
            else:
                self.wfile.write(f"ERROR: Unknown command {command}\n".encode())


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple, job: dict):
        self.job, self.log = job, []
        super().__init__(address, Handler)


def serve(job: dict, host: str = "127.0.0.1", port: int = 0) -> Server:
    """A server on a thread of this process (the unit tests'); .shutdown() ends it."""
    server = Server((host, port), job)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server


def main(argv: list) -> int:
    parser = argparse.ArgumentParser(prog="nccl_ras.py")
    parser.add_argument("--job", required=True)
    parser.add_argument("--listen", default="127.0.0.1:28028")
    parser.add_argument("--log", help="append each command received to this file")
    args = parser.parse_args(argv)
    with open(args.job) as handle:
        job = json.load(handle)
    host, _, port = args.listen.rpartition(":")
    server = Server((host, int(port)), job)
    print(f"listening {host}:{server.server_address[1]}", flush=True)
    try:
        if args.log:
            class Logged(list):
                def append(self, command: str) -> None:
                    with open(args.log, "a") as out:
                        out.write(command + "\n")
            server.log = Logged()
        server.serve_forever()
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
