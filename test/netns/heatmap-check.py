#!/usr/bin/env python3
"""Check rail-check's heatmap (--svg FILE) and a browser's screenshot of it.

  heatmap-check.py SVG --fail A B [--rail N] [--cells N] [--png PNG]

SVG: well-formed XML whose cells marked failed (class "cell fail") are the
pair A <-> B and only it: both directions in both panels, four cells, A and B
matching the end of rail-check's labels (e.g. "#0:rca1" for host#0:rca1).
Where an operator reads them: each such cell lies in the row of its sender's
host label and the column of its receiver's, and with --rail N in the block
captioned rail N. --cells N: N cells in all, failed or not.
PNG (a screenshot at the SVG's size, as chromium --headless --screenshot
takes it): the picture was drawn (its size, many colours, not a blank page),
and the failure marker's red fills part of every failed cell and none of the
others. Python's standard library only. Exit status 0, or 1 with the reason.
"""
import argparse
import struct
import sys
import xml.etree.ElementTree as ET
import zlib

NS = "{http://www.w3.org/2000/svg}"


def fail(msg):
    print("heatmap-check: FAILED: " + msg)
    sys.exit(1)


def labels(root):
    """Host labels and rail captions: (class, text, x, y), x and y where the text starts."""
    out = []
    for t in root.iter(NS + "text"):
        cls = t.get("class")
        if cls not in ("row", "col", "rail"):
            continue
        if t.get("transform"):  # translate(X Y) rotate(-90)
            x, y = t.get("transform").split("(")[1].split(")")[0].split()
        else:
            x, y = t.get("x"), t.get("y")
        out.append((cls, t.text or "", float(x), float(y)))
    return out


def where(cell, marks, rail):
    """"" when the operator finds the cell under its pair's labels, else what is wrong."""
    _, frm, to, _, (x, y, w, h) = cell
    if not any(c == "row" and frm.startswith(t + ":") and y <= ly <= y + h
               for c, t, _, ly in marks):
        return "no row label of %s's host beside the cell at y %g" % (frm, y)
    if not any(c == "col" and to.startswith(t + ":") and x <= lx <= x + w
               for c, t, lx, _ in marks):
        return "no column label of %s's host above the cell at x %g" % (to, x)
    caps = sorted((lx, t) for c, t, lx, _ in marks if c == "rail" and lx <= x)
    if rail is not None and (not caps or caps[-1][1].split(" (")[0].split()[-1] != str(rail)):
        return "the cell at x %g is in the block of %s, not rail %d" % (
            x, caps[-1][1] if caps else "no rail", rail)
    return ""


def cells(svg_path):
    """The SVG's size, its cells (class, from, to, step, (x, y, w, h)), its labels."""
    try:
        root = ET.parse(svg_path).getroot()
    except ET.ParseError as e:
        fail("%s is not well-formed XML: %s" % (svg_path, e))
    if root.tag != NS + "svg":
        fail("the root element is %s, not svg" % root.tag)
    out = []
    for g in root.iter(NS + "g"):
        cls = g.get("class", "")
        if cls not in ("cell", "cell fail"):
            continue
        r = g.find(NS + "rect")
        box = tuple(float(r.get(k)) for k in ("x", "y", "width", "height"))
        out.append((cls, g.get("data-from"), g.get("data-to"), g.get("data-step"), box))
    return int(root.get("width")), int(root.get("height")), out, labels(root)


def png_pixels(path):
    """(width, height, rows of RGB(A) bytes) of an 8-bit, non-interlaced RGB or RGBA PNG."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail("%s is not a PNG" % path)
    pos, idat, hdr = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            hdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    w, h, depth, ctype, _, _, interlace = hdr
    if depth != 8 or ctype not in (2, 6) or interlace:
        fail("%s: a PNG kind this check does not read (depth %d, colour type %d)"
             % (path, depth, ctype))
    bpp = 3 if ctype == 2 else 4
    raw, stride, rows, prev = zlib.decompress(idat), w * bpp, [], bytearray(w * bpp)
    for y in range(h):
        start = y * (stride + 1)
        ft, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if ft == 1:
                line[i] = (line[i] + a) & 255
            elif ft == 2:
                line[i] = (line[i] + b) & 255
            elif ft == 3:
                line[i] = (line[i] + ((a + b) >> 1)) & 255
            elif ft == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(line)
        prev = line
    return w, h, bpp, rows


def red_in(rows, bpp, box):
    """Pixels of the failure marker's red (#d7191c, anti-aliased) inside box."""
    x, y, w, h = (int(round(v)) for v in box)
    n = 0
    for row in rows[y:y + h]:
        for px in range(x, x + w):
            r, g, b = row[px * bpp:px * bpp + 3]
            n += r >= 170 and g <= 90 and b <= 90
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("svg")
    ap.add_argument("--fail", nargs=2, required=True, metavar=("A", "B"))
    ap.add_argument("--rail", type=int)
    ap.add_argument("--cells", type=int)
    ap.add_argument("--png")
    o = ap.parse_args()
    width, height, cs, marks = cells(o.svg)
    bad = [c for c in cs if c[0] == "cell fail"]
    a, b = o.fail
    for _, f, t, step, _ in bad:
        if not ((f.endswith(a) and t.endswith(b)) or (f.endswith(b) and t.endswith(a))):
            fail("the SVG marks %s -> %s (%s) failed, not the pair %s <-> %s" % (f, t, step, a, b))
    if len(bad) != 4:
        fail("%d cells marked failed, not 4 (the pair %s <-> %s both ways, two panels)"
             % (len(bad), a, b))
    if o.cells is not None and len(cs) != o.cells:
        fail("%d cells, not %d" % (len(cs), o.cells))
    for c in bad:
        if where(c, marks, o.rail):
            fail("the failed cell %s -> %s: %s" % (c[1], c[2], where(c, marks, o.rail)))
    print("heatmap-check: %s: %d cells, the failed ones %s <-> %s (%s)%s, under their labels"
          % (o.svg, len(cs), bad[0][1], bad[0][2], bad[0][3],
             "" if o.rail is None else " in rail %d's block" % o.rail))
    if not o.png:
        return
    w, h, bpp, rows = png_pixels(o.png)
    if (w, h) != (width, height):
        fail("the screenshot is %dx%d, the SVG %dx%d" % (w, h, width, height))
    colours = {bytes(row[i:i + 3]) for row in rows[::4] for i in range(0, len(row), 4 * bpp)}
    if len(colours) < 20:
        fail("the screenshot has %d colours: the browser drew nothing (blank page)"
             % len(colours))
    for cls, f, t, _, box in cs:
        n, area = red_in(rows, bpp, box), box[2] * box[3]
        if cls == "cell fail" and n < 0.15 * area:
            fail("the failed cell %s -> %s shows %d red pixels of %d" % (f, t, n, area))
        if cls == "cell" and n:
            fail("the healthy cell at %s shows %d red pixels" % (box,  n))
    print("heatmap-check: %s: %dx%d, %d colours, red in the %d failed cells only"
          % (o.png, w, h, len(colours), len(bad)))


if __name__ == "__main__":
    main()
