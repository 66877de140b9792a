package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/sandboxd/sandboxd/internal/progress"
	"github.com/sandboxd/sandboxd/rootfs"
)

func init() {
	commands["image"] = command{
		summary: "unpack, list and garbage-collect runtime images (rootfs cache)",
		run:     runImage,
	}
}

const imageUsage = `usage:
  sandboxd image unpack --image REF --cache DIR   unpack REF; prints its digest and rootfs path
  sandboxd image ls --cache DIR                   list unpacked images
  sandboxd image gc --cache DIR [--keep REF]...   remove images not kept and not in use

REF is oci-layout:PATH[:TAG], docker-archive:PATH or a registry reference.
gc keeps every --keep REF (default: $EXECUTION_PYTHON_IMAGE if set, else the
most recently unpacked image) and every image a running worker uses.`

func runImage(args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprintln(os.Stderr, imageUsage)
		if len(args) == 0 {
			return usagef("missing subcommand (unpack, ls, gc)")
		}
		return nil
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	switch args[0] {
	case "unpack":
		return imageUnpack(ctx, args[1:], os.Stdout, progress.NewMeter(os.Stderr, progress.IsTerminal(os.Stderr)))
	case "ls":
		return imageLs(args[1:], os.Stdout)
	case "gc":
		return imageGC(ctx, args[1:], os.Stdout)
	default:
		return usagef("unknown subcommand %q (unpack, ls, gc)", args[0])
	}
}

// refList is a repeatable --keep REF flag.
type refList []string

func (m *refList) String() string     { return strings.Join(*m, ",") }
func (m *refList) Set(v string) error { *m = append(*m, v); return nil }

func imageFlags(name string) (*flag.FlagSet, *string) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cache := fs.String("cache", "", "rootfs cache directory (required)")
	return fs, cache
}

func parseImageFlags(fs *flag.FlagSet, args []string, cache *string) error {
	if err := fs.Parse(args); err != nil {
		return usagef("%s: %v", fs.Name(), err)
	}
	if fs.NArg() > 0 {
		return usagef("%s: unexpected argument %q", fs.Name(), fs.Arg(0))
	}
	if *cache == "" {
		return usagef("%s: --cache DIR is required", fs.Name())
	}
	return nil
}

// imageUnpack prints the digest and rootfs path on out; progress (one line
// per stage, and on a terminal a status line) and the summary go to m.
func imageUnpack(ctx context.Context, args []string, out io.Writer, m *progress.Meter) error {
	fs, cache := imageFlags("unpack")
	ref := fs.String("image", "", "image reference (required)")
	if err := parseImageFlags(fs, args, cache); err != nil {
		return err
	}
	if *ref == "" {
		return usagef("unpack: --image REF is required")
	}
	c, err := rootfs.Open(*cache)
	if err != nil {
		return err
	}
	if err := c.CheckReachable(); err != nil {
		m.Line("warning: %v", err)
	}
	c.Progress = unpackProgress(m, func(p rootfs.Progress) { m.Line("%s", describeUnpack(p)) })
	start := time.Now()
	img, err := c.Unpack(ctx, *ref)
	m.Clear()
	if err != nil {
		return err
	}
	how := "unpacked"
	if img.Cached {
		how = "cached"
	}
	fmt.Fprintf(out, "digest %s\nrootfs %s\n", img.Digest, img.RootfsPath)
	m.Line("%s in %s: %d entries, %d bytes, %d dropped",
		how, time.Since(start).Round(time.Millisecond), img.Entries, img.Bytes, img.DroppedCount)
	return nil
}

func imageLs(args []string, out io.Writer) error {
	fs, cache := imageFlags("ls")
	if err := parseImageFlags(fs, args, cache); err != nil {
		return err
	}
	c, err := rootfs.Open(*cache)
	if err != nil {
		return err
	}
	imgs, err := c.List()
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DIGEST\tUNPACKED\tBYTES\tENTRIES\tREF\tROOTFS")
	for _, img := range imgs {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\n", img.Digest, img.UnpackedAt.Format(time.RFC3339),
			img.Bytes, img.Entries, img.Ref, img.RootfsPath)
	}
	return tw.Flush()
}

func imageGC(ctx context.Context, args []string, out io.Writer) error {
	fs, cache := imageFlags("gc")
	var keepRefs refList
	fs.Var(&keepRefs, "keep", "image reference to keep (repeatable)")
	if err := parseImageFlags(fs, args, cache); err != nil {
		return err
	}
	c, err := rootfs.Open(*cache)
	if err != nil {
		return err
	}
	if len(keepRefs) == 0 {
		if env := os.Getenv("EXECUTION_PYTHON_IMAGE"); env != "" {
			keepRefs = append(keepRefs, env)
		}
	}
	var keep []string
	for _, r := range keepRefs {
		img, err := rootfs.Resolve(ctx, r)
		if err != nil {
			return fmt.Errorf("keep %s: %w", r, err)
		}
		d, err := img.Digest()
		if err != nil {
			return fmt.Errorf("keep %s: %w", r, err)
		}
		keep = append(keep, d.String())
	}
	if len(keepRefs) == 0 {
		imgs, err := c.List()
		if err != nil {
			return err
		}
		if len(imgs) > 0 {
			keep = append(keep, imgs[len(imgs)-1].Digest)
		}
	}
	removed, err := c.GC(keep...)
	for _, d := range removed {
		fmt.Fprintf(out, "removed %s\n", d)
	}
	return err
}
