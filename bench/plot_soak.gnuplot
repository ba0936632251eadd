# Plots comm_soak's soak.dat over time: each server's descriptors, its resident memory, and the
# good clients' latency (median and worst per second; failures as points on the top edge).
#   gnuplot -e "dir='soak'" bench/plot_soak.gnuplot      # reads dir/soak.dat, writes dir/soak.png
# Columns: t lsn_fds lsn_rss_mb node_fds node_rss_mb comm_p50_us comm_max_us comm_fail
#          connect_p50_us connect_fail actor_p50_us actor_max_us actor_fail garbage halfopen churn
#          hostile

if (!exists("dir")) dir = 'soak'
datafile = dir.'/soak.dat'

set terminal pngcairo size 1200,1100 noenhanced
set output dir.'/soak.png'
set multiplot layout 3,1 title "comm_soak: listener and node under garbage, half-open sockets, churn and hostile frames"
set grid
set key top left
set xlabel "time (s)"

# -1 marks a second without a sample: not plotted.
sampled(x) = x < 0 ? NaN : x

set ylabel "open descriptors"
plot datafile using 1:2 with lines lw 2 title "listener server", \
     datafile using 1:4 with lines lw 2 title "node server"

set ylabel "resident memory (MB)"
plot datafile using 1:3 with lines lw 2 title "listener server", \
     datafile using 1:5 with lines lw 2 title "node server"

set ylabel "good client latency (ms)"
set logscale y
plot datafile using 1:(sampled($6)/1000) with lines lw 2 title "libcomm AM round trip, median", \
     datafile using 1:(sampled($7)/1000) with lines dt 2 title "libcomm AM round trip, worst", \
     datafile using 1:(sampled($9)/1000) with lines lw 2 title "new connection + first round trip", \
     datafile using 1:(sampled($11)/1000) with lines lw 2 title "actor request, median", \
     datafile using 1:(sampled($12)/1000) with lines dt 2 title "actor request, worst", \
     datafile using 1:($8 + $10 + $13 > 0 ? 2000 : NaN) with points pt 7 title "failures in that second"
unset multiplot
