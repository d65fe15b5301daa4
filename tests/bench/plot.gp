# plot.gp: the picture of tests/bench/run.sh's results. run.sh calls it as
#   gnuplot -e "datafile='plot.dat'; outfile='results.png'; termname='pngcairo'; c1='100'; \
#               subtitle='...'" tests/bench/plot.gp
# datafile: one line per server configuration, "label" then sessions/s at concurrency c1, 1000,
# 10000 and 10000 with a 10 ms reply delay, then server CPU µs/session at the same four (NaN
# where there is no such row). Two panels of grouped bars: sessions/s (log scale: durable Maildir
# rows are far below the sink ones) and server CPU per session.
if (!exists("datafile")) datafile = 'plot.dat'
if (!exists("outfile")) outfile = 'results.png'
if (!exists("termname")) termname = 'pngcairo'
if (!exists("c1")) c1 = '100'
if (!exists("subtitle")) subtitle = ''

if (termname eq 'pngcairo') {
    set terminal pngcairo size 1400,1100 enhanced font 'Sans,11' noenhanced
} else {
    set terminal png size 1400,1100 noenhanced
}
set output outfile
set datafile missing 'NaN'
stats datafile using (1) nooutput
nrows = STATS_records
set xrange [-0.6:nrows - 0.4]
set bmargin 7

set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set grid ytics lc rgb '#dddddd'
set xtics rotate by 30 right nomirror scale 0
set key top right horizontal
set border 3
set ytics nomirror

set linetype 1 lc rgb '#4e79a7'
set linetype 2 lc rgb '#f28e2b'
set linetype 3 lc rgb '#e15759'
set linetype 4 lc rgb '#76b7b2'

set multiplot layout 2,1 title 'smtpe benchmark: '.subtitle

set title 'Sessions per second (log scale; higher is better)'
set logscale y
set yrange [10:*]
set format y '%.0f'
plot datafile using 2:xtic(1) title c1.' concurrent', \
     '' using 3 title '1000 concurrent', \
     '' using 4 title '10000 concurrent', \
     '' using 5 title '10000 concurrent + 10 ms reply delay'

set title 'Server CPU per session, µs (user + system, all server processes; lower is better)'
unset logscale y
set yrange [0:*]
plot datafile using 6:xtic(1) title c1.' concurrent', \
     '' using 7 title '1000 concurrent', \
     '' using 8 title '10000 concurrent', \
     '' using 9 title '10000 concurrent + 10 ms reply delay'

unset multiplot
