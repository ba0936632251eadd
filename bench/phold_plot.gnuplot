# Plots bench/phold.sh's .dat file: committed events/s against the number of processes (one line
# per remote fraction) and against the remote fraction (one line per process count), for the
# small and the large configuration.
#   gnuplot -e "datafile='phold.dat'; outfile='phold.png'; configs='small large'" phold_plot.gnuplot
# Columns of the data file: config remote processes events_per_s efficiency remote_fraction
# rounds digest.

if (!exists("datafile")) datafile = 'phold.dat'
if (!exists("outfile")) outfile = 'phold.png'
if (!exists("configs")) configs = 'small large'

set terminal pngcairo size 1400,450 * words(configs) noenhanced
set output outfile
set multiplot layout words(configs),2 title "PHOLD on libcomm's simulation engine: committed events/s (median)"
set grid
set key top right
set ylabel "M events/s"
set yrange [0:*]

# The rows of configuration `cfg` whose column `k` is `v`, sorted by column `x`, through awk.
rows(cfg, k, v, x) = sprintf("< awk '$1 == \"%s\" && $%d == %s' '%s' | sort -g -k%d", \
                             cfg, k, v, datafile, x)

do for [cfg in configs] {
  set title cfg." configuration: events/s against processes"
  set xlabel "processes"
  set xtics (1, 2, 4)
  set xrange [0.8:4.2]
  plot for [r in "0.1 0.25 1.0"] rows(cfg, 2, r, 3) using 3:($4 / 1e6) \
       with linespoints lw 2 title "remote ".r
  set title cfg." configuration: events/s against the remote fraction"
  set xlabel "remote fraction"
  set xtics (0.1, 0.25, 1.0)
  set xrange [0:1.05]
  plot for [n in "1 2 4"] rows(cfg, 3, n, 2) using 2:($4 / 1e6) \
       with linespoints lw 2 title n." process".(n eq "1" ? "" : "es")
}
unset multiplot
