# Plots bench/compare_ucx.sh's .dat file against message size, UCX and libcomm side by side:
# tag_lat latency, tag_bw bandwidth, and RMA bandwidth (put_bw, get).
#   gnuplot -e "datafile='compare_ucx.dat'; outfile='compare_ucx.png'; transport='tcp'" \
#     plot_compare.gnuplot
# Columns of the data file: test size unit ucx ours ratio.

if (!exists("datafile")) datafile = 'compare_ucx.dat'
if (!exists("outfile")) outfile = 'compare_ucx.png'
if (!exists("transport")) transport = 'shared memory'

set terminal pngcairo size 1800,500 noenhanced
set output outfile
set multiplot layout 1,3 title sprintf("libcomm vs UCX on %s (median over rounds)", transport)
set logscale x 2
set key top left
set grid
set xlabel "message size (bytes)"
set xrange [4:8388608]
set xtics ("8" 8, "64" 64, "512" 512, "4K" 4096, "32K" 32768, "256K" 262144, "1M" 1048576, \
           "4M" 4194304)

# A column's value on rows of test `t` (and larger than `min` bytes), else NaN so it is skipped.
pick(t, min, c) = (strcol(1) eq t && $2 > min) ? column(c) : NaN

set title "tag_lat: one-way latency (lower is better)"
set ylabel "usec"
set logscale y
plot datafile using 2:(pick("tag_lat", 0, 4)) with linespoints lw 2 title "UCX", \
     datafile using 2:(pick("tag_lat", 0, 5)) with linespoints lw 2 title "libcomm"

set title "tag_bw: bandwidth (higher is better)"
set ylabel "MB/s"
plot datafile using 2:(pick("tag_bw", 8, 4)) with linespoints lw 2 title "UCX", \
     datafile using 2:(pick("tag_bw", 8, 5)) with linespoints lw 2 title "libcomm"

set title "RMA bandwidth: put_bw (window 32), get (one at a time)"
set xrange [16384:4194304]
plot datafile using 2:(pick("put_bw", 0, 4)) with linespoints lw 2 title "UCX put", \
     datafile using 2:(pick("put_bw", 0, 5)) with linespoints lw 2 title "libcomm put", \
     datafile using 2:(pick("get", 0, 4)) with linespoints lw 2 dt 2 title "UCX get", \
     datafile using 2:(pick("get", 0, 5)) with linespoints lw 2 dt 2 title "libcomm get"

unset multiplot
