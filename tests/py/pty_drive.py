"""Runs a command in a pseudo-terminal (160x45), sends keys at given seconds, saves what it
drew. usage: pty_drive.py RAW_OUT SECONDS:KEYS... -- COMMAND..."""
import fcntl, os, pty, select, signal, struct, sys, termios, time

out = sys.argv[1]
i = sys.argv.index("--")
plan = [(float(a.split(":", 1)[0]), a.split(":", 1)[1]) for a in sys.argv[2:i]]
cmd = sys.argv[i + 1:]
pid, fd = pty.fork()
if pid == 0:
    os.environ["TERM"] = "xterm-256color"
    os.execvp(cmd[0], cmd)
fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 45, 160, 0, 0))
start = time.time()
buf = bytearray()
status = None
while True:
    now = time.time() - start
    while plan and plan[0][0] <= now:
        os.write(fd, plan.pop(0)[1].encode())
    r, _, _ = select.select([fd], [], [], 0.1)
    if r:
        try:
            data = os.read(fd, 65536)
        except OSError:
            data = b""
        if not data:
            break
        buf += data
    done, st = os.waitpid(pid, os.WNOHANG)
    if done:
        status = st
        break
    if now > (plan[-1][0] if plan else 0) + 40:
        os.kill(pid, signal.SIGTERM)
if status is None:
    _, status = os.waitpid(pid, 0)
open(out, "wb").write(bytes(buf))
print(f"pty_drive: exit status {os.waitstatus_to_exitcode(status)}, {len(buf)} bytes drawn")
