"""cffi declarations of the blocks part of the native library (see _cdefs.PARTS)."""

CDEF = ""
INCLUDE = ""
