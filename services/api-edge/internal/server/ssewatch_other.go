//go:build !linux

package server

import "errors"

// sseWatchSupported: hijacked SSE streams need the Linux epoll watcher;
// elsewhere every stream stays on net/http.
const sseWatchSupported = false

type sseWatcher struct{}

func (s *Server) sseWatch() *sseWatcher { return &sseWatcher{} }

func (w *sseWatcher) add(*sseConn) error { return errors.New("not supported") }

func (w *sseWatcher) remove(*sseConn) {}
