//go:build !linux

package wsserver

import "io/fs"

// stampOf has no inode or ctime to rely on here, so nothing is cached.
func stampOf(fs.FileInfo) (stamp, bool) { return stamp{}, false }
