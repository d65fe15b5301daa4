# plot.gp: the picture of bindings/ruby/bench/run.sh's results. run.sh calls it as
#   gnuplot -e "datafile='plot.dat'; outfile='results.png'; termname='pngcairo'; c1='1000'; \
#               c2='10000'; d2='10'; subtitle='...'" bindings/ruby/bench/plot.gp
# datafile (table.rb --plot-data): one line per server configuration ("threads smtpe",
# "threads ruby", ..., "C epoll"), then sessions/s at c1 concurrent without delay and at c2 with
# a reply delay of d2 ms, server CPU us/session at the same two, peak RSS MiB at the same two
# (NaN where there is no such row). Three panels of grouped bars.
if (!exists("datafile")) datafile = 'plot.dat'
if (!exists("outfile")) outfile = 'results.png'
if (!exists("termname")) termname = 'pngcairo'
if (!exists("c1")) c1 = '1000'
if (!exists("c2")) c2 = '10000'
if (!exists("d2")) d2 = '10'
if (!exists("subtitle")) subtitle = ''

if (termname eq 'pngcairo') {
    set terminal pngcairo size 1400,1500 enhanced font 'Sans,11' noenhanced
} else {
    set terminal png size 1400,1500 noenhanced
}
set output outfile
set datafile missing 'NaN'
stats datafile using (1) nooutput
nrows = STATS_records
set xrange [-0.6:nrows - 0.4]
set bmargin 6

set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set grid ytics lc rgb '#dddddd'
set xtics rotate by 30 right nomirror scale 0
set border 3
set ytics nomirror
set linetype 1 lc rgb '#4e79a7'
set linetype 2 lc rgb '#e15759'

t1 = c1.' concurrent, no delay'
t2 = c2.' concurrent, '.d2.' ms before each reply'

set multiplot layout 3,1 title 'smtpe Ruby benchmark (server.rb with the gem "smtpe" or the pure-Ruby baseline "ruby"; C = smtpe-server): '.subtitle margins 0.06,0.98,0.07,0.92 spacing 0,0.11
set key at screen 0.5,0.955 center horizontal

set title 'Sessions per second (log scale; higher is better)'
set logscale y
set yrange [1:*]
set format y '%.0f'
plot datafile using 2:xtic(1) title t1, '' using 3 title t2
unset key

unset logscale y
set yrange [0:*]
set format y '%g'
set title 'Server CPU per session, µs (user + system, all server processes; lower is better)'
plot datafile using 4:xtic(1) title t1, '' using 5 title t2

set title 'Server peak RSS, MiB (sum of VmHWM over the server processes)'
plot datafile using 6:xtic(1) title t1, '' using 7 title t2

unset multiplot
