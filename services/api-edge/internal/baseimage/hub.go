package baseimage

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"
)

// Tag API limits of 11.12.
const (
	pageSize       = 100
	maxTags        = 200
	requestTimeout = 10 * time.Second
)

// Tag is one tag of the repository as the tag API lists it.
type Tag struct {
	Name        string    `json:"name"`
	LastUpdated time.Time `json:"last_updated"`
}

type tagPage struct {
	Next    *string `json:"next"`
	Results []Tag   `json:"results"`
}

// FetchTags lists up to 200 tags of repo (Docker Hub namespace/repo; a bare
// name is an official library/ image) from the Docker Hub tag API at
// apiURL, 100 a page and 10 s a request, newest last_updated first. Any
// failed page fails the whole listing.
func FetchTags(ctx context.Context, client *http.Client, apiURL, repo string) ([]Tag, error) {
	path := repo
	if !strings.Contains(path, "/") {
		path = "library/" + path
	}
	var tags []Tag
	for page := 1; len(tags) < maxTags; page++ {
		q := url.Values{"page_size": {fmt.Sprint(pageSize)}, "page": {fmt.Sprint(page)}, "ordering": {"last_updated"}}
		p, err := fetchPage(ctx, client, strings.TrimRight(apiURL, "/")+"/v2/repositories/"+path+"/tags?"+q.Encode())
		if err != nil {
			return nil, fmt.Errorf("list tags of %s (page %d): %w", repo, page, err)
		}
		tags = append(tags, p.Results...)
		if p.Next == nil || *p.Next == "" || len(p.Results) == 0 {
			break
		}
	}
	if len(tags) > maxTags {
		tags = tags[:maxTags]
	}
	sort.SliceStable(tags, func(i, j int) bool { return tags[i].LastUpdated.After(tags[j].LastUpdated) })
	return tags, nil
}

func fetchPage(ctx context.Context, client *http.Client, u string) (tagPage, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	var p tagPage
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return p, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return p, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return p, fmt.Errorf("GET %s: status %s", u, resp.Status)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 8<<20)).Decode(&p); err != nil {
		return p, fmt.Errorf("decode %s: %w", u, err)
	}
	return p, nil
}
