package main

import (
	"bytes"
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"slices"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// chartSeries is one row of the latency chart.
type chartSeries struct {
	Label   string
	Samples []float64 // ms
	Color   color.RGBA
	Heading string // when set, a group heading is drawn above this row
}

var (
	colPoolOn  = color.RGBA{0x1b, 0x9e, 0x77, 0xff} // green: warm pool
	colPoolOff = color.RGBA{0xd9, 0x5f, 0x02, 0xff} // orange: cold path via API
	colOurs    = color.RGBA{0xe7, 0x29, 0x8a, 0xff} // magenta: sandboxd run
	colPeer    = color.RGBA{0x75, 0x70, 0xb3, 0xff} // purple: peers
	colWarm    = color.RGBA{0x66, 0xa6, 0x1e, 0xff} // olive: warm interpreter
	colExt     = color.RGBA{0x44, 0x44, 0x44, 0xff}
	colGrid    = color.RGBA{0xdd, 0xdd, 0xdd, 0xff}
	colGridMin = color.RGBA{0xf0, 0xf0, 0xf0, 0xff}
	colText    = color.RGBA{0x22, 0x22, 0x22, 0xff}
)

// chartSeriesOf lists the rows: API cells, cold launchers, warm interpreter.
func chartSeriesOf(r *Report) []chartSeries {
	var out []chartSeries
	heading := "HTTP API (POST /v1/executions)"
	for _, c := range r.API {
		if c.N == 0 {
			continue
		}
		col := colPoolOff
		switch {
		case c.Pool == "external":
			col = colExt
		case c.PoolSize > 0:
			col = colPoolOn
		}
		label := fmt.Sprintf("%-6s %-12s %s c=%d", c.Workload, c.Pool, c.Mode, c.Concurrency)
		if c.Mode == "warm" {
			label = fmt.Sprintf("%-6s %-12s warm", c.Workload, c.Pool)
		}
		out = append(out, chartSeries{Label: label, Samples: c.Samples, Color: col, Heading: heading})
		heading = ""
	}
	heading = "cold launchers, whole process"
	for _, kind := range peerKinds {
		for _, p := range r.Peers {
			s, ok := p.Kinds[kind]
			if p.Skipped != "" || !ok || s.N == 0 {
				continue
			}
			col := colPeer
			if p.Ours {
				col = colOurs
			}
			out = append(out, chartSeries{Label: fmt.Sprintf("%-6s %s", kind, p.Name), Samples: s.Samples, Color: col, Heading: heading})
			heading = ""
		}
	}
	if r.Warm != nil {
		heading = "same work in an already-warm interpreter (exec only)"
		for _, w := range workloads {
			for _, phase := range []string{"first", "steady"} {
				s := r.Warm.First[w.Name]
				if phase == "steady" {
					s = r.Warm.Steady[w.Name]
				}
				if s.N == 0 {
					continue
				}
				out = append(out, chartSeries{Label: fmt.Sprintf("%-6s %s exec", w.Name, phase), Samples: s.Samples, Color: colWarm, Heading: heading})
				heading = ""
			}
		}
	}
	return out
}

// Chart geometry, in pixels.
const (
	chartWidth   = 1180
	chartLabelW  = 330
	chartRight   = 100 // the p50 column
	chartTop     = 48
	chartRowH    = 18
	chartHeadH   = 20
	chartBottomH = 56
)

// renderChart draws a horizontal strip-and-box plot of every series on a
// log-scale latency axis: one dot per run (jittered within the row), a box
// from p25 to p75 and a bar at the median.
func renderChart(r *Report) ([]byte, error) {
	series := chartSeriesOf(r)
	height := chartTop + chartBottomH
	for _, s := range series {
		height += chartRowH
		if s.Heading != "" {
			height += chartHeadH
		}
	}
	if len(series) == 0 {
		height += chartRowH
	}
	img := image.NewRGBA(image.Rect(0, 0, chartWidth, height))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)

	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range series {
		for _, v := range s.Samples {
			if v > 0 {
				lo, hi = math.Min(lo, v), math.Max(hi, v)
			}
		}
	}
	if math.IsInf(lo, 0) {
		lo, hi = 1, 1000
	}
	// The axis starts at 0.1 ms at the lowest: below that (print(1) exec'd
	// in a warm interpreter takes microseconds) nothing is worth the width;
	// such dots sit on the left edge and their median is printed.
	decLo, decHi := math.Max(-1, math.Floor(math.Log10(lo))), math.Ceil(math.Log10(hi))
	if decHi <= decLo {
		decHi = decLo + 1
	}
	x0, x1 := chartLabelW, chartWidth-chartRight
	xOf := func(v float64) int {
		f := (math.Log10(math.Max(v, math.Pow(10, decLo))) - decLo) / (decHi - decLo)
		return x0 + int(math.Round(f*float64(x1-x0)))
	}
	plotBottom := height - chartBottomH

	// Grid: a line per decade, lighter ones at 2× and 5×.
	for d := decLo; d <= decHi; d++ {
		base := math.Pow(10, d)
		vline(img, xOf(base), chartTop-6, plotBottom, colGrid)
		label := msLabel(base)
		drawText(img, xOf(base)-len(label)*7/2, plotBottom+16, label, colText)
		if d < decHi {
			for _, m := range []float64{2, 5} {
				vline(img, xOf(base*m), chartTop-6, plotBottom, colGridMin)
			}
		}
	}
	drawText(img, chartWidth-12-len("p50 ms")*7, chartTop-10, "p50 ms", colText)
	drawText(img, x0, 20, "sandboxd latency distribution  (dots: each run; box: p25-p75; bar: p50)", colText)
	drawText(img, x0, 36, fmt.Sprintf("%s, %d CPUs, %s", r.Meta.Time, r.Meta.CPUs, r.Meta.Commit), colText)
	axis := "latency, ms (log scale)"
	drawText(img, x0+(x1-x0)/2-len(axis)*7/2, plotBottom+36, axis, colText)

	y := chartTop
	for i, s := range series {
		if s.Heading != "" {
			y += chartHeadH
			drawText(img, 8, y-5, s.Heading+":", colText)
		}
		mid := y + chartRowH/2
		drawText(img, 16, mid+4, truncate(s.Label, (chartLabelW-24)/7), colText)
		if len(s.Samples) > 0 {
			sorted := slices.Clone(s.Samples)
			slices.Sort(sorted)
			q1, q2, q3 := Percentile(sorted, 25), Percentile(sorted, 50), Percentile(sorted, 75)
			light := color.RGBA{s.Color.R, s.Color.G, s.Color.B, 0x50}
			fillRect(img, xOf(q1), mid-6, xOf(q3)+1, mid+7, light)
			rectOutline(img, xOf(q1), mid-6, xOf(q3)+1, mid+7, s.Color)
			for j, v := range s.Samples {
				// Deterministic jitter so equal values stay visible.
				jit := int((uint32(i*7919+j*104729)*2654435761)>>29) - 4
				fillRect(img, xOf(v)-1, mid+jit-1, xOf(v)+2, mid+jit+2, s.Color)
			}
			fillRect(img, xOf(q2)-1, mid-8, xOf(q2)+2, mid+9, colText)
			txt := fmtMS(q2)
			drawText(img, chartWidth-12-len(txt)*7, mid+4, txt, colText)
		}
		y += chartRowH
	}
	hline(img, x0, x1, plotBottom, colText)
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func msLabel(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%gs", v/1000)
	default:
		return fmt.Sprintf("%gms", v)
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:max(0, n-1)] + "~"
}

func drawText(img *image.RGBA, x, y int, s string, c color.Color) {
	d := &font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(s)
}

func vline(img *image.RGBA, x, y0, y1 int, c color.RGBA) {
	for y := y0; y <= y1; y++ {
		img.SetRGBA(x, y, c)
	}
}

func hline(img *image.RGBA, x0, x1, y int, c color.RGBA) {
	for x := x0; x <= x1; x++ {
		img.SetRGBA(x, y, c)
	}
}

// fillRect blends c (with its alpha) over [x0,x1)×[y0,y1).
func fillRect(img *image.RGBA, x0, y0, x1, y1 int, c color.RGBA) {
	draw.Draw(img, image.Rect(x0, y0, x1, y1), image.NewUniform(color.NRGBA{c.R, c.G, c.B, c.A}), image.Point{}, draw.Over)
}

func rectOutline(img *image.RGBA, x0, y0, x1, y1 int, c color.RGBA) {
	hline(img, x0, x1-1, y0, c)
	hline(img, x0, x1-1, y1-1, c)
	vline(img, x0, y0, y1-1, c)
	vline(img, x1-1, y0, y1-1, c)
}
