"""What a host of a Kiln job sees of its network (shared by the programs in this folder): the
address and netmask of an interface (ioctl, as `ip addr` reads them), the interfaces present, the
default route, and whether a TCP connection to an address opens. Standard library only."""

import fcntl
import ipaddress
import os
import socket
import struct

SIOCGIFADDR = 0x8915
SIOCGIFNETMASK = 0x891B


def _ioctl_addr(ifname, request):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        packed = struct.pack("256s", ifname[:15].encode())
        try:
            return socket.inet_ntoa(fcntl.ioctl(s.fileno(), request, packed)[20:24])
        except OSError:
            return None


def interface(ifname="eth0"):
    """{"address", "netmask", "network", "gateway" (the subnet's first address)} or None."""
    addr = _ioctl_addr(ifname, SIOCGIFADDR)
    if addr is None:
        return None
    mask = _ioctl_addr(ifname, SIOCGIFNETMASK)
    net = ipaddress.ip_network("%s/%s" % (addr, mask), strict=False)
    return {"address": addr, "netmask": mask, "network": str(net), "gateway": str(net.network_address + 1)}


def interfaces():
    try:
        return sorted(os.listdir("/sys/class/net"))
    except OSError:
        return []


def default_route():
    """The default route's gateway from /proc/net/route, or None when there is none."""
    try:
        with open("/proc/net/route") as f:
            rows = [line.split() for line in f.read().splitlines()[1:]]
    except OSError:
        return None
    for row in rows:
        if len(row) > 2 and row[1] == "00000000":
            return socket.inet_ntoa(struct.pack("<I", int(row[2], 16)))
    return None


def resolve(name):
    try:
        return socket.gethostbyname(name)
    except OSError as e:
        return "error: %s" % e


def try_connect(host, port, timeout=3.0):
    """"ok", or "fail <why>" when no TCP connection opens within `timeout`."""
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as s:
            s.settimeout(timeout)
            try:
                s.sendall(b"hello\n")
            except OSError:
                pass
        return "ok"
    except OSError as e:
        return "fail %s" % (e.__class__.__name__ if not e.strerror else e.strerror)
