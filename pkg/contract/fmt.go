package contract

import (
	"fmt"
	"strconv"
)

func itoa(n int) string { return strconv.Itoa(n) }

func sprintf(format string, args ...any) string {
	if len(args) == 0 {
		return format
	}
	return fmt.Sprintf(format, args...)
}
