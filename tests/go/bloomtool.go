// bloomtool: the Go side of tests/go_interop.rs, built from Debian's packages of
// bits-and-blooms/bloom (3.3.1) and bitset, offline (GO111MODULE=off, GOPATH at the packages).
// Items are "<prefix><i>" for i in [from, to).
//
//	bloomtool make N FPR PREFIX FROM TO OUT      NewWithEstimates(N, FPR), adds the items,
//	                                            writes WriteTo to OUT and MarshalJSON to OUT.json
//	bloomtool test IN PREFIX FROM TO             ReadFrom IN (UnmarshalJSON if IN ends in .json),
//	                                            prints one 0/1 per item: Test
//	bloomtool golden                             prints base hashes and locations of fixed items
package main

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/bits-and-blooms/bloom"
)

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func num(s string) uint {
	n, err := strconv.ParseUint(s, 10, 64)
	must(err)
	return uint(n)
}

func item(prefix string, i uint) []byte {
	return []byte(prefix + strconv.FormatUint(uint64(i), 10))
}

func main() {
	switch os.Args[1] {
	case "make":
		fpr, err := strconv.ParseFloat(os.Args[3], 64)
		must(err)
		f := bloom.NewWithEstimates(num(os.Args[2]), fpr)
		for i := num(os.Args[5]); i < num(os.Args[6]); i++ {
			f.Add(item(os.Args[4], i))
		}
		out, err := os.Create(os.Args[7])
		must(err)
		_, err = f.WriteTo(out)
		must(err)
		must(out.Close())
		j, err := f.MarshalJSON()
		must(err)
		must(os.WriteFile(os.Args[7]+".json", j, 0o644))
	case "test":
		f := &bloom.BloomFilter{}
		if strings.HasSuffix(os.Args[2], ".json") {
			data, err := os.ReadFile(os.Args[2])
			must(err)
			must(json.Unmarshal(data, f))
		} else {
			in, err := os.Open(os.Args[2])
			must(err)
			_, err = f.ReadFrom(bufio.NewReader(in))
			must(err)
		}
		w := bufio.NewWriter(os.Stdout)
		for i := num(os.Args[4]); i < num(os.Args[5]); i++ {
			if f.Test(item(os.Args[3], i)) {
				w.WriteByte('1')
			} else {
				w.WriteByte('0')
			}
		}
		w.WriteByte('\n')
		must(w.Flush())
	case "golden":
		// Items of every tail length around the 16-byte block, where sum256 appends its
		// virtual byte differently.
		items := []string{""}
		for n := 1; n <= 33; n++ {
			items = append(items, "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG"[:n])
		}
		f := bloom.New(1000, 7)
		for _, it := range items {
			f.Add([]byte(it))
		}
		var buf bytes.Buffer
		_, err := f.WriteTo(&buf)
		must(err)
		fmt.Printf("m=%d k=%d writeto=%s\n", f.Cap(), f.K(), hex.EncodeToString(buf.Bytes()))
		small := bloom.New(70, 3)
		small.Add([]byte("go"))
		j, err := small.MarshalJSON()
		must(err)
		fmt.Printf("json %s\n", j)
		// Locations as Test reads them, through a one-item filter per item.
		for _, it := range items {
			g := bloom.New(1000, 7)
			g.Add([]byte(it))
			var locs []string
			for i, w := range g.BitSet().Bytes() {
				for b := 0; b < 64; b++ {
					if w&(1<<uint(b)) != 0 {
						locs = append(locs, strconv.Itoa(i*64+b))
					}
				}
			}
			fmt.Printf("%q %s\n", it, strings.Join(locs, ","))
		}
		for _, nf := range [][2]float64{{10000, 0.01}, {1000, 0.001}, {1, 0.5}, {1000000, 0.0001}} {
			m, k := bloom.EstimateParameters(uint(nf[0]), nf[1])
			fmt.Printf("estimate %v %v m=%d k=%d\n", nf[0], nf[1], m, k)
		}
	default:
		fmt.Fprintln(os.Stderr, "unknown command", os.Args[1])
		os.Exit(2)
	}
}
