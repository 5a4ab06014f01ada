"""Where a file holds data: its extents by SEEK_DATA/SEEK_HOLE, so copies keep holes as holes (stdlib only).

A sparse file (`truncate -s 1G f`) has an apparent size but no blocks; read byte by byte it
is all zeros, and a copy that writes those zeros makes it dense. Both snapshot paths copy
only the extents this module finds: the bubblewrap backend on the host (tree_copy.py) and
the docker backend in its container (docker_work.py, which is sent with this file's text
above its own, programs/__init__.py).

What it does not do: copy anything, or find runs of written zeros (only what the file
system reports as holes is skipped). A file system without SEEK_DATA reports the whole
file as one extent (a dense copy, never a wrong one).
"""

import errno
import os


def data_extents(fd, size):
    """[(offset, length), ...] of the data in the open file `fd` of apparent size `size`, in order."""
    extents = []
    offset = 0
    while offset < size:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # no data after offset: a hole up to the end
                break
            if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP):  # no SEEK_DATA here: all of it is data
                return [(offset, size - offset)] if offset < size else extents
            raise
        if start >= size:
            break
        end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        extents.append((start, end - start))
        offset = end
    return extents
