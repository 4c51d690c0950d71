package bench

import (
	"fmt"
	"image/color"
	"math"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// palette gives each policy row a distinct colour; the first (the default
// policy) is drawn thickest.
var palette = []color.RGBA{
	{0xd6, 0x27, 0x28, 0xff}, {0x1f, 0x77, 0xb4, 0xff}, {0x2c, 0xa0, 0x2c, 0xff}, {0xff, 0x7f, 0x0e, 0xff},
	{0x94, 0x67, 0xbd, 0xff}, {0x8c, 0x56, 0x4b, 0xff}, {0xe3, 0x77, 0xc2, 0xff}, {0x7f, 0x7f, 0x7f, 0xff},
	{0xbc, 0xbd, 0x22, 0xff}, {0x17, 0xbe, 0xcf, 0xff},
}

// style gives row i's line its colour; rows past the palette's length are
// dashed, and the first (the default policy) is drawn thickest.
func style(ls *draw.LineStyle, i int) {
	ls.Color = palette[i%len(palette)]
	ls.Width = vg.Points(1)
	if i >= len(palette) {
		ls.Dashes = []vg.Length{vg.Points(4), vg.Points(2)}
	}
}

// Plot draws, for each workload, the distribution of time to first token
// of every policy (the share of requests answered within x seconds, x on a
// log scale), one panel a workload, to a PNG file.
func Plot(file string, rep Report) error {
	n := len(rep.Workloads)
	if n == 0 {
		return fmt.Errorf("nothing to plot")
	}
	cols := min(n, 2)
	rows := (n + cols - 1) / cols
	plots := make([][]*plot.Plot, rows)
	for i := range plots {
		plots[i] = make([]*plot.Plot, cols)
	}
	for wi, t := range rep.Workloads {
		p := plot.New()
		p.Title.Text = fmt.Sprintf("%s (%d requests, %d servers)", t.Name, t.Requests, t.Backends)
		p.X.Label.Text = "time to first token (s)"
		p.Y.Label.Text = "share of requests"
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = plot.LogTicks{Prec: -1}
		p.Y.Min, p.Y.Max = 0, 1
		p.Legend.Top = false
		p.Legend.Left = false
		for ri, row := range t.Results {
			ds := t.ttfts[ri]
			if len(ds) == 0 {
				continue
			}
			// at most 400 points a curve
			step := max(1, len(ds)/400)
			var pts plotter.XYs
			for i := 0; i < len(ds); i += step {
				pts = append(pts, plotter.XY{X: math.Max(ds[i].Seconds(), 1e-3), Y: float64(i+1) / float64(len(ds))})
			}
			pts = append(pts, plotter.XY{X: math.Max(ds[len(ds)-1].Seconds(), 1e-3), Y: 1})
			l, err := plotter.NewLine(pts)
			if err != nil {
				return err
			}
			style(&l.LineStyle, ri)
			if ri == 0 {
				l.Width = vg.Points(2.5)
			}
			p.Add(l)
			p.Legend.Add(row.Policy, l)
		}
		plots[wi/cols][wi%cols] = p
	}
	const w, h = 7 * vg.Inch, 4.5 * vg.Inch
	img := vgimg.New(w*vg.Length(cols), h*vg.Length(rows))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 4,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align(plots, tiles, dc)
	for r := range plots {
		for c := range plots[r] {
			if plots[r][c] != nil {
				plots[r][c].Draw(canvases[r][c])
			}
		}
	}
	return savePNG(file, img)
}

func savePNG(file string, img *vgimg.Canvas) error {
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	_, err = vgimg.PngCanvas{Canvas: img}.WriteTo(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
