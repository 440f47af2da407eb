package wsserver

// stamp identifies one version of a file for the hash cache: the same
// path with an equal stamp is assumed to hold the same bytes. changed is
// the later of mtime and ctime (Unix ns); valid is false where the
// platform offers no inode or ctime, which disables caching.
type stamp struct {
	valid   bool
	dev     uint64
	ino     uint64
	size    int64
	mtime   int64
	changed int64
}
