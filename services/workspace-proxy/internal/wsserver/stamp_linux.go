package wsserver

import (
	"io/fs"
	"syscall"
)

func stampOf(fi fs.FileInfo) (stamp, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return stamp{}, false
	}
	mtime := st.Mtim.Nano()
	return stamp{
		valid:   true,
		dev:     uint64(st.Dev), //nolint:unconvert // Dev's width differs by architecture.
		ino:     st.Ino,
		size:    st.Size,
		mtime:   mtime,
		changed: max(mtime, st.Ctim.Nano()),
	}, true
}
