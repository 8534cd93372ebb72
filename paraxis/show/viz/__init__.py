"""Pictures of the plan and the run (matplotlib, Agg backend, no display needed).

Every function returns a matplotlib Figure; `style.figure_data_uri` turns one into an
embeddable image for the HTML report. Each figure has a title, labelled axes with units and
a legend where colours carry meaning. Colours are the Okabe-Ito palette (readable by
colour-blind readers) and compute kinds also differ by hatch, so a grey-scale print still
tells forward from backward.
"""
