#!/usr/bin/env python3
"""A raw protocol-v1 peer for tests: sends exactly what it is told, prints what comes back.

usage: probe.py SOCKET STEP...
  hello                    send a hello frame
  start-true CWD           send start(/bin/true) with CWD as the cwd fd (+ stdin/out/err)
  start-fds ROLES PATH     send start(/bin/true) declaring ROLES (comma list) with PATH's fd each
  start-nofd               send start(/bin/true) declaring a cwd fd but attaching none
  start-empty CWD          send start with an empty argv
  raw HEX                  send raw bytes
  frame JSON               send JSON as one frame
  huge                     send a header announcing a 1 GiB frame
  half                     send half a frame, then shut down the write side
  sleep SECONDS            wait
  say TEXT                 print TEXT as a line at once ("connected" tells a test it is in)
  read                     read one frame and print it as a JSON line ('EOF' at end of stream)
  drain                    read frames until end of stream, printing each
Exit status 0 unless the socket itself fails to connect (2).
"""
import json
import os
import socket
import struct
import sys
import time


def frame(obj):
    body = json.dumps(obj).encode()
    return struct.pack(">I", len(body)) + body


def start(argv, roles):
    return {"type": "start", "argv": argv, "env": [["PATH", "/usr/bin:/bin"]], "fds": roles}


def read_frame(s):
    hdr = b""
    while len(hdr) < 4:
        chunk = s.recv(4 - len(hdr))
        if not chunk:
            return None
        hdr += chunk
    (n,) = struct.unpack(">I", hdr)
    body = b""
    while len(body) < n:
        chunk = s.recv(n - len(body))
        if not chunk:
            return None
        body += chunk
    return json.loads(body)


def main():
    path, steps = sys.argv[1], sys.argv[2:]
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
    except OSError as e:
        print(f"connect failed: {e}", file=sys.stderr)
        return 2
    i = 0
    while i < len(steps):
        step = steps[i]
        i += 1
        try:
            if step == "hello":
                s.sendall(frame({"type": "hello", "version": 1, "client": "probe"}))
            elif step == "start-true":
                d = os.open(steps[i], os.O_PATH | os.O_DIRECTORY)
                i += 1
                msg = frame(start(["/bin/true"], ["cwd", "stdin", "stdout", "stderr"]))
                socket.send_fds(s, [msg], [d, 0, 1, 2])
            elif step == "start-fds":
                roles, p = steps[i].split(","), steps[i + 1]
                i += 2
                fds = [os.open(p, os.O_RDONLY) for _ in roles]
                socket.send_fds(s, [frame(start(["/bin/true"], roles))], fds)
            elif step == "start-nofd":
                s.sendall(frame(start(["/bin/true"], ["cwd"])))
            elif step == "start-empty":
                d = os.open(steps[i], os.O_PATH | os.O_DIRECTORY)
                i += 1
                socket.send_fds(s, [frame(start([], ["cwd"]))], [d])
            elif step == "raw":
                s.sendall(bytes.fromhex(steps[i]))
                i += 1
            elif step == "frame":
                body = steps[i].encode()
                i += 1
                s.sendall(struct.pack(">I", len(body)) + body)
            elif step == "huge":
                s.sendall(struct.pack(">I", 1 << 30) + b"{")
            elif step == "half":
                body = json.dumps({"type": "hello", "version": 1}).encode()
                s.sendall(struct.pack(">I", len(body)) + body[: len(body) // 2])
                s.shutdown(socket.SHUT_WR)
            elif step == "sleep":
                time.sleep(float(steps[i]))
                i += 1
            elif step == "say":
                print(steps[i], flush=True)
                i += 1
            elif step == "read":
                f = read_frame(s)
                print("EOF" if f is None else json.dumps(f, sort_keys=True), flush=True)
            elif step == "drain":
                while True:
                    f = read_frame(s)
                    print("EOF" if f is None else json.dumps(f, sort_keys=True), flush=True)
                    if f is None:
                        break
            else:
                print(f"unknown step {step}", file=sys.stderr)
                return 3
        except OSError as e:
            print(f"ERR {e.__class__.__name__}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
