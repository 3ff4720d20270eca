"""The terminal modes an SSH client sends with its PTY request, applied to the session's
terminal (RFC 4254 section 8, RFC 8160 for IUTF8), as OpenSSH's sshd does.

Contract: :func:`apply_modes` takes the client's ``{opcode: value}`` map (asyncssh's
``process.term_modes``) and sets them on the terminal ``fd`` with one ``tcsetattr``: special
characters (``VERASE`` ...; 255 means disabled), input, local, output and control flags, and
the line speeds. Opcodes this system has no flag for are ignored (as sshd does), so is a
terminal that refuses the change (the session keeps the terminal's defaults). Pure apart
from the two ``termios`` calls.
"""

from __future__ import annotations

import sys
import termios
from collections.abc import Mapping

# index of each termios.tcgetattr list: iflag, oflag, cflag, lflag, ispeed, ospeed, cc
_IFLAG, _OFLAG, _CFLAG, _LFLAG, _ISPEED, _OSPEED, _CC = range(7)
_DISABLED = 255  # the SSH encoding of "no character" (_POSIX_VDISABLE here, 0 on Linux)

_CHARS = {1: "VINTR", 2: "VQUIT", 3: "VERASE", 4: "VKILL", 5: "VEOF", 6: "VEOL", 7: "VEOL2", 8: "VSTART",
          9: "VSTOP", 10: "VSUSP", 11: "VDSUSP", 12: "VREPRINT", 13: "VWERASE", 14: "VLNEXT", 15: "VFLUSH",
          16: "VSWTCH", 17: "VSTATUS", 18: "VDISCARD"}
_FLAGS = {
    30: (_IFLAG, "IGNPAR"), 31: (_IFLAG, "PARMRK"), 32: (_IFLAG, "INPCK"), 33: (_IFLAG, "ISTRIP"),
    34: (_IFLAG, "INLCR"), 35: (_IFLAG, "IGNCR"), 36: (_IFLAG, "ICRNL"), 37: (_IFLAG, "IUCLC"),
    38: (_IFLAG, "IXON"), 39: (_IFLAG, "IXANY"), 40: (_IFLAG, "IXOFF"), 41: (_IFLAG, "IMAXBEL"),
    42: (_IFLAG, "IUTF8"),
    50: (_LFLAG, "ISIG"), 51: (_LFLAG, "ICANON"), 52: (_LFLAG, "XCASE"), 53: (_LFLAG, "ECHO"),
    54: (_LFLAG, "ECHOE"), 55: (_LFLAG, "ECHOK"), 56: (_LFLAG, "ECHONL"), 57: (_LFLAG, "NOFLSH"),
    58: (_LFLAG, "TOSTOP"), 59: (_LFLAG, "IEXTEN"), 60: (_LFLAG, "ECHOCTL"), 61: (_LFLAG, "ECHOKE"),
    62: (_LFLAG, "PENDIN"),
    70: (_OFLAG, "OPOST"), 71: (_OFLAG, "OLCUC"), 72: (_OFLAG, "ONLCR"), 73: (_OFLAG, "OCRNL"),
    74: (_OFLAG, "ONOCR"), 75: (_OFLAG, "ONLRET"),
    90: (_CFLAG, "CS7"), 91: (_CFLAG, "CS8"), 92: (_CFLAG, "PARENB"), 93: (_CFLAG, "PARODD"),
}
_ISPEED_OP, _OSPEED_OP = 128, 129
# flags some Pythons' termios does not name (IUTF8 before 3.12): Linux's values
_LINUX_BITS = {"IUTF8": 0o40000} if sys.platform.startswith("linux") else {}


def termios_attrs(attrs: list, modes: Mapping[int, int]) -> list:
    """``attrs`` (a ``tcgetattr`` list) with ``modes`` applied; a new list."""
    new = [*attrs[:_CC], list(attrs[_CC])]
    for opcode, value in modes.items():
        if opcode in _CHARS:
            index = getattr(termios, _CHARS[opcode], None)
            if index is not None and index < len(new[_CC]):
                char = 0 if value == _DISABLED else value & 0xFF
                new[_CC][index] = bytes([char]) if isinstance(new[_CC][index], bytes) else char
        elif opcode in _FLAGS:
            where, name = _FLAGS[opcode]
            bit = getattr(termios, name, _LINUX_BITS.get(name))
            if bit is None:
                continue
            if name in ("CS7", "CS8"):  # values of the CSIZE field, not single bits
                if value:
                    new[where] = (new[where] & ~termios.CSIZE) | bit
            elif value:
                new[where] |= bit
            else:
                new[where] &= ~bit
        elif opcode in (_ISPEED_OP, _OSPEED_OP):
            speed = getattr(termios, f"B{value}", None)
            if speed is not None:
                new[_ISPEED if opcode == _ISPEED_OP else _OSPEED] = speed
    return new


def apply_modes(fd: int, modes: Mapping[int, int]) -> bool:
    """Set ``modes`` on the terminal ``fd``; False when the terminal refused them."""
    if not modes:
        return True
    try:
        termios.tcsetattr(fd, termios.TCSANOW, termios_attrs(termios.tcgetattr(fd), modes))
    except (termios.error, OSError):
        return False
    return True
