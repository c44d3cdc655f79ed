"""cffi declarations of the machine part of the native library (see _cdefs.PARTS)."""

CDEF = ""
INCLUDE = ""
