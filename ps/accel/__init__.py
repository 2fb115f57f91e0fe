"""Optional OS-level accelerations. Correctness never depends on any of them: each one, where it is unavailable,
leaves a slower path that gives the same results, and a reader can skip this package.

- filemap    optional: correctness never depends on it; without it (not Linux, a file system other than ext4,
             xfs or tmpfs, a failed mmap) the journal writes every record with pwritev: the same bytes on disk.
- prefault   optional: correctness never depends on it; without it (no fallocate(2), or the file system refuses
             it, or the disk is full) the journal's appends allocate their space as they go.
- hugepages  optional: correctness never depends on it; without it (no MADV_HUGEPAGE, madvise refused, arrays
             under 4 MiB) the arena and the id index sit on ordinary pages: the same zero-filled arrays.
- prefetch   optional: correctness never depends on it; without it (a CPU with no prefetch instruction) LLVM
             compiles the hint to nothing and the compiled loops compute the same.
- malloc     optional: correctness never depends on it; without it (no glibc mallopt) tune_malloc returns False
             and glibc's or the platform's default allocation applies.
ps.storage.checksum.copy_with_checksum64 is the one acceleration outside this package (it is compiled with the
checksum it must equal): without it, i.e. wherever the journal does not map its segment, the journal computes
checksum64 and writes with pwritev.

This layer imports only the foundation (ps.errors, ps.hashing, ...) and its own modules.
"""
