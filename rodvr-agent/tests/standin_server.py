"""A stand-in for a cGPU server (LUPINE's lupine_driver_server, rCUDA's daemon) for the agent's
supervisor tests and the end-to-end test: it listens on GSAAS_SERVER_PORT on every address, as
LUPINE's server does, and first prints what it was given (user, groups, PID, environment, open
descriptors) as one line of JSON after "standin ", which the tests read from its log. Each
connection is greeted with "<CUDA_VISIBLE_DEVICES> <peer address>" and echoed, as the test
suite's stand-in rCUDA servers do. STANDIN_MODE makes it misbehave as a hostile or broken server
would:

  serve          greet and echo connections (the default)
  crash          exit at once, before listening (a crash loop)
  never          never listen (a server that hangs while starting)
  hold_and_exit  listen, fork a child that keeps the listening socket, then exit (a server that
                 tries to keep its port after it ends)
  allocate       first, through the CUDA driver API (libcuda.so.1, found as the server's own
                 would be: under the agent's interposer, the stand-in driver of gpu-share/),
                 allocate each size of STANDIN_ALLOC_MIB (comma-separated MiB) and ask an IPC
                 handle for the first block, printing "alloc MIB RESULT" and "ipc RESULT" (a
                 tenant trying to get past its share); then serve
"""
import json
import os
import socket
import sys
import threading
import time

port = int(os.environ["GSAAS_SERVER_PORT"])
mode = os.environ.get("STANDIN_MODE", "serve")
fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
# The descriptor listdir used is gone once it returns.
fds = [fd for fd in fds if os.path.exists(f"/proc/self/fd/{fd}")]
info = {
    "uid": os.getuid(),
    "gid": os.getgid(),
    "groups": os.getgroups(),
    "pid": os.getpid(),
    "env": dict(os.environ),
    "fds": fds,
    "visible_pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
}
print("standin " + json.dumps(info), flush=True)
if mode == "crash":
    sys.exit(3)
if mode == "allocate":
    import ctypes

    cuda = ctypes.CDLL("libcuda.so.1")
    device, context = ctypes.c_int(), ctypes.c_void_p()
    print(f"init {cuda.cuInit(0)}", flush=True)
    cuda.cuDeviceGet(ctypes.byref(device), 0)
    cuda.cuCtxCreate_v2(ctypes.byref(context), 0, device)
    blocks = []
    for mib in os.environ.get("STANDIN_ALLOC_MIB", "").split(","):
        pointer = ctypes.c_ulonglong()
        result = cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(int(mib) << 20))
        print(f"alloc {mib} {result}", flush=True)
        if result == 0:
            blocks.append(pointer)
    handle = ctypes.create_string_buffer(64)
    if blocks:
        print(f"ipc {cuda.cuIpcGetMemHandle(handle, blocks[0])}", flush=True)
if mode == "never":
    time.sleep(3600)
listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("0.0.0.0", port))
listener.listen(64)
if mode == "hold_and_exit":
    if os.fork() == 0:
        time.sleep(3600)
        os._exit(0)
    time.sleep(0.3)
    sys.exit(1)
name = os.environ.get("CUDA_VISIBLE_DEVICES", "?")


def greet_and_echo(connection, peer):
    with connection:
        try:
            connection.sendall(f"{name} {peer}\n".encode())
            while data := connection.recv(512):
                connection.sendall(data)
        except OSError:
            pass


while True:
    connection, (peer, _) = listener.accept()
    threading.Thread(target=greet_and_echo, args=(connection, peer), daemon=True).start()
