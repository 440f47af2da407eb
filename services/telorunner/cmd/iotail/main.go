// Command iotail prints a session's terminal output from the /v1 io
// WebSocket, the way the editor's terminal receives it: replay from
// -last-seq, then live bytes until the session ends.
//
//	iotail [-url http://localhost:8062] [-app name] [-last-seq n] <sessionId>
package main

import (
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"

	"github.com/gorilla/websocket"
)

func main() {
	base := flag.String("url", "http://localhost:8062", "runner base URL")
	app := flag.String("app", "", "app channel (required when the session runs several apps)")
	lastSeq := flag.Uint64("last-seq", 0, "highest sequence number already seen")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: iotail [-url URL] [-app NAME] [-last-seq N] <sessionId>")
		os.Exit(2)
	}
	u := "ws" + strings.TrimPrefix(strings.TrimSuffix(*base, "/"), "http") + "/v1/sessions/" + url.PathEscape(flag.Arg(0)) + "/io"
	q := url.Values{"lastSeq": {fmt.Sprint(*lastSeq)}}
	if *app != "" {
		q.Set("app", *app)
	}
	// The origin of the runner itself: what a page it serves would send, and
	// what an allowlist of loopback origins accepts (contract 7.2 needs one).
	origin := strings.TrimSuffix(*base, "/")
	c, _, err := websocket.DefaultDialer.Dial(u+"?"+q.Encode(), http.Header{"Origin": {origin}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "dial:", err)
		os.Exit(1)
	}
	defer c.Close()
	for {
		kind, data, err := c.ReadMessage()
		if err != nil {
			var ce *websocket.CloseError
			if errors.As(err, &ce) {
				fmt.Fprintf(os.Stderr, "\n[closed %d %s]\n", ce.Code, ce.Text)
				if ce.Code == websocket.CloseNormalClosure {
					return
				}
				os.Exit(1)
			}
			fmt.Fprintln(os.Stderr, "read:", err)
			os.Exit(1)
		}
		if kind == websocket.TextMessage {
			fmt.Fprintf(os.Stderr, "[%s]\n", data)
			continue
		}
		if len(data) >= 5 {
			out := os.Stdout
			if data[4] == 2 {
				out = os.Stderr
			}
			_, _ = out.Write(data[5:])
		}
	}
}
