package mcp

import (
	"bytes"
	"encoding/json"
	"os"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// toolResultCase is one case of testdata/tool_results.json, shared with the
// Python client's test (tools/clients/python/test_unit.py): an answer and
// run_python's result for it (text, isError, the images inlined, the
// other artifacts). SANDBOXD_UPDATE_FIXTURE=1 writes the results from this
// package's.
type toolResultCase struct {
	Name    string          `json:"name"`
	Answer  json.RawMessage `json:"answer"`
	Text    string          `json:"text"`
	IsError bool            `json:"is_error"`
	Images  []string        `json:"images"`
	Links   []string        `json:"links"`
}

// The Python client's ToolResult is this package's run_python result, text
// for text: both are checked against one fixture.
func TestToolResultFixture(t *testing.T) {
	const path = "testdata/tool_results.json"
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cases []toolResultCase
	if err := json.Unmarshal(data, &cases); err != nil {
		t.Fatal(err)
	}
	for i, c := range cases {
		res, err := executionResult(bytes.NewReader(c.Answer))
		if err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		got := toolResultCase{Name: c.Name, Answer: c.Answer, Text: res.Content[0].(*sdk.TextContent).Text, IsError: res.IsError,
			Images: []string{}, Links: []string{}}
		var a struct{ Artifacts []struct{ Name string } }
		json.Unmarshal(c.Answer, &a)
		k := 0
		for _, b := range res.Content[1:] {
			switch b := b.(type) {
			case *sdk.ImageContent:
				got.Images = append(got.Images, a.Artifacts[k].Name)
			case *sdk.ResourceLink:
				got.Links = append(got.Links, b.Name)
			}
			k++
		}
		if os.Getenv("SANDBOXD_UPDATE_FIXTURE") == "1" {
			cases[i] = got
			continue
		}
		g, _ := json.Marshal(got)
		w, _ := json.Marshal(c)
		if !bytes.Equal(g, w) {
			t.Errorf("%s:\n got %s\nwant %s", c.Name, g, w)
		}
	}
	if os.Getenv("SANDBOXD_UPDATE_FIXTURE") == "1" {
		out, _ := json.MarshalIndent(cases, "", " ")
		if err := os.WriteFile(path, append(out, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
