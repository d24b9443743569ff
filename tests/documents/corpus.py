"""A small corpus written for the retrieval tests: short documents on distinct topics,
and questions whose answer is in one of them (named), asked in other words where English
allows it."""

from __future__ import annotations

DOCUMENTS: dict[str, str] = {
    "sourdough.md": """# Sourdough bread
A sourdough starter is a culture of wild yeast and lactic acid bacteria kept in flour and water.
Feed the starter every day with equal weights of flour and water and keep it at room temperature.

## Baking
Bake the loaf in a preheated Dutch oven at 250 °C for twenty minutes with the lid on, then twenty
more without it, until the crust is deep brown.""",
    "honeybees.md": """# Honeybees
A honeybee colony has one queen, thousands of female workers and a few hundred male drones.
Workers forage for nectar and pollen and tell each other where flowers are with the waggle dance.

The queen lays up to two thousand eggs a day in spring. Bees turn nectar into honey by
evaporating its water and store it in wax comb.""",
    "volcanoes.txt": """Volcanoes form where magma rises through the crust. Stratovolcanoes such as Mount Fuji
are steep cones of alternating lava and ash layers, and erupt explosively.

Shield volcanoes like Mauna Loa in Hawaii have gentle slopes built by fluid basalt lava flows.
Pyroclastic flows, fast clouds of hot gas and rock, are the deadliest volcanic hazard.""",
    "chess-openings.md": """# Chess openings
The Sicilian Defence answers 1.e4 with c5 and leads to sharp, unbalanced positions.
The Queen's Gambit offers a pawn on c4 to gain control of the centre.

## Principles
Develop knights before bishops, castle early to protect the king, and do not move the same
piece twice in the opening without a reason.""",
    "tides.txt": """Ocean tides are caused mainly by the gravitational pull of the Moon, and partly by the Sun.
Most coasts see two high tides and two low tides each lunar day of about 24 hours 50 minutes.

Spring tides, with the largest range, happen at new and full moon when Sun and Moon align;
neap tides, with the smallest range, happen at the quarter moons.""",
    "photosynthesis.md": """# Photosynthesis
Plants capture light energy with chlorophyll in their chloroplasts. In the light reactions,
water is split and oxygen is released; ATP and NADPH are produced.

The Calvin cycle then fixes carbon dioxide into sugar using the enzyme RuBisCO.""",
    "git-branching.md": """# Working with git branches
Create a branch with git switch -c feature and commit your work there. To bring in the latest
changes from main, rebase the branch onto main or merge main into it.

A merge conflict happens when two branches change the same lines; edit the files, git add them,
and continue the rebase or commit the merge.""",
    "marathon-training.txt": """Training for a marathon takes about sixteen to twenty weeks.
Build weekly mileage slowly,
by no more than ten percent a week, with one long run each weekend.

Taper for the last three weeks before race day: cut the distance, keep some speed.
During the race, take carbohydrate gels and water every forty minutes to avoid hitting the wall.""",
    "coffee-brewing.md": """# Brewing coffee
For pour-over coffee use a ratio of about 1 gram of coffee to 16 grams of water, with water
just off the boil at 93 °C. Grind medium-fine, like table salt.

Espresso forces hot water through finely ground coffee at nine bars of pressure in 25 to 30
seconds. A French press needs a coarse grind and four minutes of steeping.""",
    "roman-aqueducts.txt": """The Romans built aqueducts to carry water from springs in the hills to their cities.
Water flowed by gravity along a gentle, steady gradient, through tunnels, channels and arched bridges.

The Pont du Gard in southern France is a three-tiered aqueduct bridge. Rome itself was fed by
eleven aqueducts, supplying public baths, fountains and latrines.""",
    "tomato-growing.md": """# Growing tomatoes
Sow tomato seeds indoors six to eight weeks before the last frost and plant them out once nights
stay above 10 °C. Tomatoes need full sun and deep, regular watering.

Pinch out the side shoots of cordon varieties and tie the stem to a cane. Blossom end rot comes
from uneven watering and a lack of calcium.""",
    "black-holes.txt": """A black hole is a region of spacetime where gravity is so strong that nothing, not even light,
escapes once it crosses the event horizon.

Stellar black holes form when massive stars collapse at the end of their lives. Supermassive
black holes, millions of times the mass of the Sun, sit at the centres of galaxies.""",
    "vaccines.md": """# How vaccines work
A vaccine trains the immune system to recognise a pathogen without causing the disease.
It carries an antigen, a harmless piece or copy of the germ, and the body makes antibodies and
memory cells against it.

mRNA vaccines give cells instructions to make the antigen themselves. Herd immunity protects
people who cannot be vaccinated when enough others are.""",
    "python-virtualenv.md": """# Python virtual environments
Create a virtual environment with python -m venv .venv and activate it with source
.venv/bin/activate. Packages installed with pip then stay inside that directory.

Pin exact versions in requirements.txt so that every machine installs the same packages.""",
    "knitting.txt": """Knitting makes fabric from loops of yarn on two needles. Cast on the first row of stitches,
then work knit and purl stitches; garter stitch is knit on every row, stockinette alternates knit
and purl rows.

Choose needle size by the yarn's weight, and knit a gauge swatch before a sweater.""",
    "northern-lights.md": """# The northern lights
An aurora appears when charged particles from the solar wind hit oxygen and nitrogen high in
the atmosphere. Oxygen glows green and red, nitrogen blue and purple.

The best places to see the aurora borealis are near the Arctic circle, in Norway, Iceland and
Finland, on dark, clear winter nights during strong geomagnetic storms.""",
    "tax-deadlines.txt": """Self-employed people pay income tax in instalments.
Keep every receipt for business expenses,
which reduce the taxable profit.

Late filing of the annual return brings a penalty and interest on the unpaid tax, so file before
the deadline even if you cannot pay in full, and ask for a payment plan.""",
    "electric-cars.md": """# Electric cars
An electric car stores energy in a lithium-ion battery pack and drives its wheels with an
electric motor. Regenerative braking recovers energy when the car slows down.

Range depends on battery capacity, speed and temperature; cold weather can cut it by a fifth.
DC fast chargers fill a battery to 80 percent in about half an hour.""",
    "origami.txt": """Origami is the art of folding paper without cutting or glue. A valley fold folds the paper
towards you, a mountain fold away from you.

The traditional crane starts from a square base and a bird base; a thousand folded cranes are said
to grant a wish.""",
    "sleep-hygiene.md": """# Sleeping well
Adults need seven to nine hours of sleep. Go to bed and get up at the same time every day,
even at weekends, to keep the circadian rhythm steady.

Avoid caffeine after midday and bright screens in the hour before bed; blue light delays the
release of melatonin. Keep the bedroom cool, dark and quiet.""",
    "bicycle-repair.md": """# Fixing a flat bicycle tyre
Remove the wheel, lever one side of the tyre off the rim and pull out the inner tube. Pump it up
and listen or feel for the puncture, then roughen the area and apply a patch with glue.

Check the inside of the tyre for the thorn or glass that caused the flat before refitting.""",
    "wine-tasting.txt": """Tasting wine has three steps: look at the colour, swirl and smell the aroma, then taste for
sweetness, acidity, tannin and body.

Tannins come from grape skins and seeds and give red wines their drying feel. Serve white wine
chilled and red wine slightly below room temperature.""",
    "earthquakes.md": """# Earthquakes
Earthquakes happen when stress builds along a fault and the rocks slip suddenly, sending seismic
waves through the ground. The moment magnitude scale measures the energy released.

During an earthquake, drop to the ground, take cover under a sturdy table and hold on until the
shaking stops.""",
    "composting.txt": """A compost heap turns kitchen and garden waste into humus. Mix green material rich in nitrogen,
such as vegetable peelings and grass cuttings, with brown material rich in carbon, such as
cardboard and dry leaves.

Turn the heap every few weeks to let air in; a heap that smells bad is too wet and lacks browns.""",
    "piano-practice.md": """# Practising the piano
Practise scales and arpeggios slowly with a metronome, then raise the tempo a little each day.
Play hands separately before putting a difficult passage together.

Short daily practice of thirty minutes beats one long session a week.""",
    "cheese-making.txt": """Cheese is made by curdling milk with rennet and a starter culture of bacteria. The curd is
cut, heated and drained of whey, then pressed into moulds and salted.

Hard cheeses such as cheddar and parmesan are aged for months in caves or cellars, where
moisture and temperature are controlled.""",
}

# (question, the document that answers it)
QUESTIONS: list[tuple[str, str]] = [
    ("How often should I feed my starter for bread?", "sourdough.md"),
    ("What does the waggle dance tell other workers?", "honeybees.md"),
    ("Why are pyroclastic flows so dangerous?", "volcanoes.txt"),
    ("What is a good reply to e4 for black in the opening?", "chess-openings.md"),
    ("When do spring tides happen?", "tides.txt"),
    ("Which enzyme fixes carbon dioxide in plants?", "photosynthesis.md"),
    ("How do I resolve a merge conflict when rebasing?", "git-branching.md"),
    ("How many weeks should I taper before race day?", "marathon-training.txt"),
    ("What ratio of coffee to water for pour-over?", "coffee-brewing.md"),
    ("How did water move along the Roman aqueducts?", "roman-aqueducts.txt"),
    ("What causes blossom end rot?", "tomato-growing.md"),
    ("What is the event horizon?", "black-holes.txt"),
    ("How do mRNA vaccines make the antigen?", "vaccines.md"),
    ("How do I activate a venv for pip packages?", "python-virtualenv.md"),
    ("What is the difference between garter stitch and stockinette?", "knitting.txt"),
    ("Where can I see the aurora borealis?", "northern-lights.md"),
    ("Does cold weather reduce the range of a battery car?", "electric-cars.md"),
    ("Why should I avoid screens before bed?", "sleep-hygiene.md"),
    ("How do I find the puncture in an inner tube?", "bicycle-repair.md"),
    ("My compost heap smells bad, what should I do?", "composting.txt"),
]

# (question, the document that answers it): asked in words the document does not use, so
# that only their meaning leads to it. None of their searchable words (search.query_terms)
# is in the document they name, stemmed as the full-text index stems them
# (test_retrieval.py checks it); the retrieval benchmark (bench/retrieval.py) scores them.
PARAPHRASES: list[tuple[str, str]] = [
    ("How often do I give my leaven a meal?", "sourdough.md"),
    ("How many offspring does the ruling insect of a hive produce daily?", "honeybees.md"),
    ("What kind of fire mountain has mild inclines made by runny molten stone?", "volcanoes.txt"),
    ("At the start of a board game, should I bring out horses ahead of the diagonal sliders?", "chess-openings.md"),
    ("What makes the sea rise and fall twice daily?", "tides.txt"),
    ("How do green leaves turn sunshine into food?", "photosynthesis.md"),
    ("Both forks of my project touched identical code; how do I reconcile the clash?", "git-branching.md"),
    ("How should I prepare over months for a 42 km footrace?", "marathon-training.txt"),
    ("What proportion of beans to liquid suits a manual filter drip?", "coffee-brewing.md"),
    ("How did the ancient empire of Italy transport fresh liquid to its towns?", "roman-aqueducts.txt"),
    ("Why do the bottoms of my red garden fruits turn black and rotten?", "tomato-growing.md"),
    ("What is the boundary beyond which a cosmic sinkhole traps everything?", "black-holes.txt"),
    ("How does a jab teach our defences to fight infections?", "vaccines.md"),
    ("How do I keep third-party libraries of one coding project isolated from others?", "python-virtualenv.md"),
    ("How do I begin a scarf with wool and a pair of sticks?", "knitting.txt"),
    ("What makes the polar sky shimmer with colours?", "northern-lights.md"),
    ("What happens if I submit my yearly paperwork to the revenue office after the cutoff?", "tax-deadlines.txt"),
    ("How far can a plug-in vehicle go on a single charge in winter?", "electric-cars.md"),
    ("How can I nod off more easily at night?", "sleep-hygiene.md"),
    ("How do I mend a bike whose rubber has gone soft from a leak?", "bicycle-repair.md"),
]
