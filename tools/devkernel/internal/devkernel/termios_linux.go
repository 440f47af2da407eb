package devkernel

import "golang.org/x/sys/unix"

const ioctlReadTermios = unix.TCGETS

const ioctlWriteTermios = unix.TCSETS
